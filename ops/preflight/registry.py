"""The checklist's registry: every check's stable id, severity, one-line description and remediation.

The testinfra tests in ``checklist.py`` name their check by id (``@check("SWAP-ACTIVE")``); everything a reader
sees about a check (report rows, JUnit names, docs/checklist.md) comes from this table, so ids never drift.
A check with ``depends_on`` is reported as blocked, not failed, on a host where one of those checks failed:
a stopped service is one finding (SVC-ACTIVE), not six.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ERROR = "error"
WARNING = "warning"
SEVERITIES = (ERROR, WARNING)
ID_RE = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$")

# What the remediation texts call the operator's inventory and artifact; the report prints them as is.
SITE = "vlfleet site --inventory INVENTORY --artifact ARTIFACT_DIR --limit HOST"


@dataclass(frozen=True)
class Check:
    id: str
    severity: str
    area: str  # groups rows in the docs: cpu, runtime, model, system, service
    description: str  # one line: what must be true
    remediation: str  # exactly what to run or change when it is not
    depends_on: tuple[str, ...] = ()
    not_applicable: str = ""  # where the check reports n/a instead of pass or fail (docs)


CHECKS: tuple[Check, ...] = (
    # Every other check implicitly depends on this one: nothing can be checked on a host we cannot reach.
    Check("HOST-REACHABLE", ERROR, "system",
          "The host answers over SSH as the inventory's user, with sudo -n (root needs none).",
          "Check the inventory's ansible_host, ansible_user and key by hand (`ssh -i KEY USER@HOST sudo -n true`); "
          "give that user passwordless sudo (a file in /etc/sudoers.d/ with `USER ALL=(ALL) NOPASSWD: ALL`)."),
    Check("CPU-AVX2", ERROR, "cpu", "The CPU has AVX2 (OpenVINO's int4/int8 CPU kernels need it).",
          "Move the service to a host whose CPU has AVX2 (x86-64 Haswell or newer). On a VM, expose the host CPU's "
          "flags (qemu/libvirt: `-cpu host` or a CPU model with AVX2; cloud: pick an instance type with AVX2)."),
    Check("CPU-AVX512", WARNING, "cpu", "The CPU has AVX-512 (faster int8/int4 kernels; VNNI/AMX reported too).",
          "Nothing to fix on this host: it runs on AVX2 kernels, slower per token. For the fastest decode, "
          "schedule the fleet on CPUs with AVX-512 VNNI or AMX (Xeon Ice Lake / Sapphire Rapids or newer), or "
          "waive this check for hosts that are slow on purpose (`--ignore CPU-AVX512`)."),
    Check("CPU-GOVERNOR", WARNING, "cpu", "Every CPU's cpufreq governor is `performance`.",
          f"Run `{SITE} --tags cpu_tuning` (sets the governor now and at boot via vlfleet-cpu-tuning.service); "
          "by hand: `echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor`.",
          not_applicable="containers, and hosts whose kernel exposes no cpufreq (most VMs: the hypervisor owns the "
                         "frequency)"),
    Check("RELEASE-LAYOUT", ERROR, "runtime",
          "/opt/vlfleet/current points to a release with venv/bin/python and vlfleet.env.",
          f"Install a release: `{SITE} --tags python_runtime,vlm_service`. If `current` points to a deleted "
          "release, the same command re-links it."),
    Check("PYTHON-VERSION", ERROR, "runtime", "The service venv's Python runs and is 3.10 or newer.",
          f"`{SITE} --tags python_runtime` installs the distribution's venv package first (role os_packages; Ubuntu "
          "22.04: python3.10-venv; with vlfleet_os_packages_install=false, bake it into the image). For another "
          "Python >= 3.10, rebuild the wheelhouse for it (`vlfleet wheelhouse.build --python X.Y`) and run the same.",
          depends_on=("RELEASE-LAYOUT",)),
    Check("RUNTIME-VERSIONS", ERROR, "runtime",
          "The service venv has the pinned openvino, openvino-genai and openvino-tokenizers, and they import.",
          "Roll out a release built from the pinned wheelhouse: `vlfleet wheelhouse.build --python X.Y`, then "
          f"`{SITE} --tags python_runtime,vlm_service`. Never pip-install into the release venv by hand.",
          depends_on=("RELEASE-LAYOUT",)),
    Check("MODEL-ARTIFACT", ERROR, "model",
          "The model artifact in VLFLEET_MODEL_DIR matches its manifest (sha256 of every file) and the runtime "
          "is new enough for it.",
          f"Re-copy the artifact: `{SITE} --tags model_artifact` (replaces every file that differs from the "
          "manifest), then `sudo systemctl restart vlfleet`. If the runtime is too old, roll out a newer release "
          "or convert the model with the host's OpenVINO.",
          depends_on=("RELEASE-LAYOUT",)),
    Check("TMP-LOCAL", ERROR, "system",
          "/tmp and /var/tmp (uploads, the service's private tmp) are on local filesystems with >= 1 GiB free.",
          "Mount /tmp and /var/tmp from local disk or tmpfs, not NFS/CIFS/FUSE (fstab, or "
          "`sudo systemctl enable --now tmp.mount`), and free space there (`sudo du -xsh /tmp/* /var/tmp/*`)."),
    Check("SWAP-ACTIVE", ERROR, "system", "Swap is active and RAM + swap cover the model's peak RSS + 1 GiB.",
          f"Run `{SITE} --tags swap` (creates /swapfile, swapon, fstab entry); by hand: "
          "`sudo swapon -a` if /swapfile is in /etc/fstab. Size it with swap_file_size_mb.",
          not_applicable="containers (swapon is refused; swap is the container host's)"),
    Check("MEM-HEADROOM", ERROR, "system",
          "Available memory (+ free swap) lets the service reach the model's peak RSS with 512 MiB to spare.",
          "Stop other memory users on the host (`ps aux --sort=-rss | head`), add swap "
          f"(`{SITE} --tags swap` with a larger swap_file_size_mb), or use a host with more RAM or a smaller "
          "artifact (int4).",
          depends_on=("RELEASE-LAYOUT",)),
    Check("DISK-FREE", ERROR, "system",
          "The models filesystem has room for one more artifact + 1 GiB; the compiled-model cache has >= 1 GiB.",
          f"Free space on the filesystem of /opt/vlfleet/models (`{SITE} --tags model_artifact` prunes old "
          "artifacts beyond model_artifact_keep) and of /var/cache/vlfleet (`sudo rm -rf /var/cache/vlfleet/*` "
          "is safe: it is rebuilt on the next start), or grow the disk.",
          depends_on=("RELEASE-LAYOUT",)),
    Check("SVC-ENABLED", ERROR, "service", "vlfleet.service is enabled (starts at boot).",
          "`sudo systemctl enable vlfleet` (or `" + SITE + " --tags vlm_service`)."),
    Check("SVC-ACTIVE", ERROR, "service", "vlfleet.service is active (running).",
          "`sudo systemctl start vlfleet`, then check why it stopped: `sudo journalctl -u vlfleet -n 100`. "
          f"If it keeps failing, fix what the journal names and run `{SITE} --tags vlm_service`."),
    Check("SVC-RESTART", ERROR, "service", "vlfleet.service restarts on failure (Restart= set, RestartSec > 0).",
          f"Run `{SITE} --tags vlm_service` (the unit sets Restart=on-failure); remove drop-ins that override "
          "Restart= (`systemctl cat vlfleet` lists them), then `sudo systemctl daemon-reload`."),
    Check("SVC-NOFILE", ERROR, "service", "The running service process may open >= 65535 files (/proc/PID/limits).",
          "Remove the drop-in that lowers LimitNOFILE (`systemctl cat vlfleet` shows it, under "
          "/etc/systemd/system/vlfleet.service.d/), or set vlfleet_nofile and run `" + SITE + " --tags "
          "vlm_service`; then `sudo systemctl daemon-reload && sudo systemctl restart vlfleet`.",
          depends_on=("SVC-ACTIVE",)),
    Check("CPU-AFFINITY", WARNING, "service",
          "The running process's CPU affinity is the launcher's plan (/run/vlfleet/cpu-plan.json).",
          "`sudo systemctl restart vlfleet` (the launcher re-plans and pins); if it differs again, look for "
          "CPUAffinity= drop-ins (`systemctl cat vlfleet`) or a taskset wrapper and remove them.",
          depends_on=("SVC-ACTIVE",)),
    Check("NUMA-LOCAL", WARNING, "service",
          "On a host with several NUMA nodes, the service's threads run on one node and its memory is bound to it.",
          "Install numactl (`" + SITE + " --tags vlm_service` does, role os_packages) and "
          "`sudo systemctl restart vlfleet`: the launcher pins the threads to one node and binds memory there with "
          "`numactl --membind` only when numactl is installed. Remove CPUAffinity=/NUMAPolicy= drop-ins "
          "(`systemctl cat vlfleet`) that undo it.",
          depends_on=("SVC-ACTIVE",),
          not_applicable="hosts with one NUMA node (every CPU reads local memory)"),
    Check("PORT-LISTEN", ERROR, "service",
          "The service listens on VLFLEET_HOST:VLFLEET_PORT and on no other address.",
          "Set vlm_service_host / vlm_service_port in the inventory and run `" + SITE + " --tags vlm_service`; "
          "if another process holds the port, find it with `sudo ss -ltnp 'sport = :PORT'` and stop it.",
          depends_on=("SVC-ACTIVE",)),
    Check("SVC-READYZ", ERROR, "service", "GET /readyz answers 200 (model loaded and warmed up), naming the "
          "configured artifact (VLFLEET_MODEL_DIR's; on the llamacpp engine VLFLEET_LLAMACPP_MODEL_DIR's).",
          "Read the reason in the /readyz body and `sudo journalctl -u vlfleet -n 100`; a model still loading "
          "needs time, a failed load needs the artifact fixed (see MODEL-ARTIFACT), then "
          "`sudo systemctl restart vlfleet`.",
          depends_on=("SVC-ACTIVE",)),
    Check("SVC-STREAM", ERROR, "service",
          "POST /v1/chat/completions with stream=true (one image) streams tokens and [DONE] within the bound.",
          "Read `sudo journalctl -u vlfleet -n 100` for the request's error; a slow answer means an overloaded "
          "host (see CPU-AFFINITY, MEM-HEADROOM) or a too large VLFLEET_IMAGE_MAX_SIDE; then "
          "`sudo systemctl restart vlfleet`.",
          depends_on=("SVC-READYZ",)),
    Check("ENGINE-TUNED", WARNING, "service",
          "The service runs the engine `vlfleet tune` measured as the fastest within budget on this host "
          "(/etc/vlfleet/tuned.json).",
          "Run `vlfleet tune --inventory INVENTORY --limit HOST` again (it measures every engine and restarts on the "
          "fastest), or restart on the recorded one: `sudo systemctl restart vlfleet` when /etc/vlfleet/engine.env "
          "still names it; otherwise look for what overrides VLFLEET_ENGINE after that file (`systemctl cat "
          "vlfleet`: drop-ins with Environment= or EnvironmentFile=).",
          depends_on=("SVC-READYZ",),
          not_applicable="hosts never tuned (no /etc/vlfleet/tuned.json): they run the release's VLFLEET_ENGINE"),
    Check("CLOCK-SYNC", WARNING, "system", "The system clock is synchronised (NTP).",
          "`sudo timedatectl set-ntp true` with systemd-timesyncd or chrony installed and an NTP server reachable "
          "(`timedatectl timesync-status` / `chronyc tracking` say which).",
          not_applicable="containers (the clock is the container host's kernel clock)"),
)

_BY_ID = {c.id: c for c in CHECKS}


def get(check_id: str) -> Check:
    try:
        return _BY_ID[check_id]
    except KeyError:
        raise KeyError(f"unknown check id {check_id!r}; known: {', '.join(ids())}") from None


def ids() -> list[str]:
    return [c.id for c in CHECKS]


def problems() -> list[str]:
    """Inconsistencies in the table itself (tested): bad ids, duplicates, unknown or later dependencies."""
    out: list[str] = []
    seen: set[str] = set()
    for c in CHECKS:
        if not ID_RE.match(c.id):
            out.append(f"{c.id}: id must look like AREA-NAME in capitals")
        if c.id in seen:
            out.append(f"{c.id}: duplicate id")
        if c.severity not in SEVERITIES:
            out.append(f"{c.id}: severity {c.severity!r} not one of {SEVERITIES}")
        if not c.description or not c.remediation:
            out.append(f"{c.id}: needs a description and a remediation")
        # Dependencies must come first: a fleet run checks them in table order.
        out += [f"{c.id}: depends on {d}, which is not an earlier check" for d in c.depends_on if d not in seen]
        seen.add(c.id)
    return out

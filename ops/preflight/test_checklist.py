"""The pre-launch checklist, as testinfra tests: one test per registry check id (ops/preflight/registry.py).

Run it three ways: `vlfleet preflight` (the fleet, one pytest per host in parallel), plain pytest::

    PATH=$PWD/.venv/bin:$PATH pytest -p no:cacheprovider ops/preflight/test_checklist.py \
        --hosts='ansible://vlm' --ansible-inventory=INVENTORY [--preflight-json out.json] [--preflight-junit out.xml]

or the `preflight` Ansible role (ops/playbooks/preflight.yml). What a failure means and how to fix it lives in the
registry, not here; a test asserts one fact, with a message that says what was found.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import PurePosixPath

import pytest

from ops.fleet import host_program
from ops.host import client
from ops.host.layout import service_address
from ops.preflight.plugin import check, not_applicable
from service.runtime.contract import TUNED_FILE

GiB = 1024**3
MiB = 1024**2
# Peak RSS of the service for an artifact of N bytes: ~512 MiB of runtime + 1.6 x the weights (CPU plugin's repacked
# copy plus buffers). Matches the measured int4 (1.7 GB -> 3.2 GB) and int8 (2.4 GB -> 4.4 GB) 2B artifacts.
RSS_BASE_MB, RSS_PER_ARTIFACT = 512, 1.6
FALLBACK_PEAK_MB = 3300  # the int4 2B model, when the artifact cannot be read
SYSTEM_PYTHON = "python3"  # runs the snapshot, which must work before any release (and its venv) exists
REMOTE_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "sshfs", "fuse.sshfs", "glusterfs", "fuse.glusterfs",
             "ceph", "fuse.ceph", "lustre", "afs", "davfs", "fuse.rclone", "fuse.s3fs"}


@dataclass(frozen=True)
class Config:
    root: str
    service: str
    pins: dict[str, str]
    min_nofile: int
    first_token_timeout: float
    stream_timeout: float


@pytest.fixture(scope="session")
def cfg(request: pytest.FixtureRequest) -> Config:
    opt = request.config.getoption
    raw = opt("preflight_pins")
    if raw:
        pins = [p.strip() for p in raw.split(",") if p.strip()]
    else:
        from ops.wheelhouse import host_pins

        pins = host_pins()
    pinned = dict(p.split("==", 1) for p in pins if "==" in p)
    return Config(opt("preflight_root"), opt("preflight_service"), pinned, opt("preflight_min_nofile"),
                  opt("preflight_first_token_timeout"), opt("preflight_stream_timeout"))


@functools.cache
def is_root(host) -> bool:
    """Whether the checklist logs in as root: then it needs no sudo (and a minimal host may have none)."""
    return host.run("id -u").stdout.strip() == "0"


def run(host, command: str, *args: object, timeout: int = 60, sudo: bool = True):
    """A command on the host, bounded by timeout(1); as root unless told otherwise."""
    line = f"timeout {timeout} " + command
    if sudo and not is_root(host):
        with host.sudo():
            return host.run(line, *[str(a) for a in args])
    return host.run(line, *[str(a) for a in args])


@functools.cache
def program_on(host) -> str:
    """The host program's path on the host, put there unless it is there with its sha256: with the ansible://
    backend's copy module (as root); a local:// host runs the controller's archive."""
    program = host_program.build()
    if host.backend.NAME == "local":
        return str(program.path)
    if run(host, "sha256sum %s", program.remote).stdout.split()[:1] != [program.sha256]:
        if host.backend.NAME != "ansible":
            raise AssertionError(f"the host program is not on the host ({program.remote}) and the {host.backend.NAME}"
                                 ":// backend cannot put it there: run the checklist with --hosts=ansible://...")
        done = host.ansible("copy", f"src={program.path} dest={program.remote.rsplit('/', 1)[0]}/ owner=root "
                            "group=root mode=0644", check=False, become=not is_root(host))
        if done.get("failed") or run(host, "sha256sum %s", program.remote).stdout.split()[:1] != [program.sha256]:
            raise AssertionError(f"could not put the host program at {program.remote}: {done.get('msg', '')}")
    return program.remote


def probe(host, python: str, command: str, *args: object, timeout: int = 60):
    """Run the host program's probe ``command`` on the host with ``python`` (as root); its last stdout line is
    JSON."""
    line = [python, program_on(host), command, *(str(a) for a in args)]
    res = run(host, " ".join(["%s"] * len(line)), *line, timeout=timeout)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise AssertionError(f"{python} could not run the {command} probe (exit {res.rc}): "
                             f"{(res.stderr or res.stdout).strip()[-400:]}") from None


# -- facts shared by the checks of one host (module scope = one host: testinfra parametrizes per host) ---------

@pytest.fixture(scope="module")
def facts(host, cfg: Config) -> dict[str, str]:
    """Every shell-level fact of the host, read by one root process (the host program's snapshot probe): section ->
    text."""
    try:
        sections = probe(host, SYSTEM_PYTHON, "snapshot", cfg.root, cfg.service, timeout=120)
    except AssertionError as e:
        raise AssertionError(f"could not read the host's state: {e}") from None
    return {k: v.strip() for k, v in sections.items()}


def keyvalues(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.lstrip().startswith("#"))


@pytest.fixture(scope="module")
def virt(facts) -> dict:
    return {"what": facts["virt"] or "none", "container": facts["container"] == "yes"}


@pytest.fixture(scope="module")
def unit(facts) -> dict[str, str]:
    return keyvalues(facts["unit"])


@pytest.fixture(scope="module")
def release(facts, cfg: Config) -> dict:
    """The current release: its directory, venv python and env file (None values when missing)."""
    return {"current": f"{cfg.root}/current", "target": facts["target"] or None, "python": facts["python"] or None,
            "env": keyvalues(facts["env"]) if facts["env"] else None}


def need_release(release: dict) -> tuple[str, dict]:
    # RELEASE-LAYOUT failing blocks the dependents; this guards a plain pytest -k run of one check.
    assert release["python"] and release["env"] is not None, \
        f"no usable release under {release['current']} (see RELEASE-LAYOUT)"
    return release["python"], release["env"]


@pytest.fixture(scope="module")
def artifact(facts, release: dict) -> dict:
    """The configured model artifact's manifest summary: dir, artifact_id, bytes (None when unreadable)."""
    info = {"dir": (release["env"] or {}).get("VLFLEET_MODEL_DIR"), "artifact_id": None, "bytes": None}
    try:
        manifest = json.loads(facts["manifest"])
        info["artifact_id"] = manifest.get("artifact_id")
        info["bytes"] = sum(int(f.get("size", 0)) for f in manifest.get("files", {}).values())
    except (ValueError, AttributeError, TypeError):
        pass
    return info


def peak_rss_mb(artifact: dict) -> int:
    if not artifact["bytes"]:
        return FALLBACK_PEAK_MB
    return int(RSS_BASE_MB + RSS_PER_ARTIFACT * artifact["bytes"] / MiB)


@pytest.fixture(scope="module")
def meminfo(facts) -> dict[str, int]:
    out = {}
    for line in facts["meminfo"].splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) // 1024  # kB -> MiB
    return out


def main_pid(unit: dict) -> int:
    pid = int(unit.get("MainPID") or 0)
    assert pid > 0, f"the service has no main process (ActiveState={unit.get('ActiveState')}; see SVC-ACTIVE)"
    return pid


def df_rows(text: str, *paths: str) -> list[dict]:
    rows = [ln.split() for ln in text.splitlines() if ln.strip()]
    assert len(rows) == len(paths) and all(len(r) == 3 and r[2].isdigit() for r in rows), \
        f"df {' '.join(paths)} failed: {text[:300]}"
    return [{"path": p, "mount": r[0], "fstype": r[1], "avail": int(r[2])} for p, r in zip(paths, rows, strict=True)]


def readyz_url(env: dict) -> str:
    return client.base_url(*service_address(env)) + "/readyz"


@pytest.fixture(scope="module")
def runtime(host, release) -> dict:
    """The service venv's Python version and runtime distributions (the runtime-versions probe), or the error."""
    python, _ = need_release(release)
    try:
        return probe(host, python, "runtime-versions", timeout=120)
    except AssertionError as e:
        return {"error": str(e)}


# -- the checks, in registry order ----------------------------------------------------------------------------

@check("HOST-REACHABLE")
def test_host_reachable(host, record_property):
    try:
        res = host.run("timeout 60 sh -c 'id -un && { [ \"$(id -u)\" = 0 ] || sudo -n true; }'")
    except RuntimeError as e:  # testinfra's ssh backend raises on exit 255 (could not connect)
        result = e.args[0] if e.args else None
        why = getattr(result, "stderr", None) or str(e)
        raise AssertionError(f"ssh failed: {why.strip()[-300:]}") from None
    assert res.rc == 0, f"sudo -n failed (exit {res.rc}): {(res.stderr or res.stdout).strip()[-300:]}"
    user = res.stdout.split()[0]
    record_property("found", f"as {user}" + (" (root: no sudo needed)" if user == "root" else ", sudo -n works"))


@check("CPU-AVX2")
def test_cpu_avx2(facts, record_property):
    flags = set(facts["flags"].partition(":")[2].split())
    assert "avx2" in flags, "the CPU does not report avx2 in /proc/cpuinfo"
    record_property("found", "avx2" + (", fma" if "fma" in flags else ""))


@check("CPU-AVX512")
def test_cpu_avx512(facts, record_property):
    flags = set(facts["flags"].partition(":")[2].split())
    extras = [f for f in ("avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8") if f in flags]
    assert "avx512f" in flags, "no AVX-512 (avx512f missing); also present: " + (", ".join(extras) or "no VNNI/AMX")
    record_property("found", "avx512f" + "".join(f", {f}" for f in extras))


@check("CPU-GOVERNOR")
def test_cpu_governor(facts, virt, record_property):
    lines = facts["governors"].splitlines()
    if not lines:
        if virt["container"]:
            not_applicable(f"containers cannot see or set cpufreq ({virt['what']}); the container host owns it")
        not_applicable(f"no cpufreq on this host ({virt['what']}): the kernel exposes no frequency governor"
                       + (", the hypervisor controls CPU frequency" if virt["what"] != "none" else ""))
    governors = {ln.split("/")[5]: ln.rsplit(":", 1)[1].strip() for ln in lines}
    wrong = {cpu: g for cpu, g in governors.items() if g != "performance"}
    assert not wrong, "governor is not performance on " + ", ".join(f"{c}={g}" for c, g in sorted(wrong.items()))
    record_property("found", f"performance on {len(governors)} CPU(s)")


@check("RELEASE-LAYOUT")
def test_release_layout(release, record_property):
    assert release["target"], f"{release['current']} is missing or points to a path that does not exist"
    assert "/releases/" in release["target"], f"{release['current']} -> {release['target']}, not under releases/"
    assert release["python"], f"{release['target']}/venv/bin/python is missing or not executable"
    assert release["env"] is not None, f"{release['target']}/vlfleet.env is missing or empty"
    record_property("found", f"current -> {PurePosixPath(release['target']).name}")


@check("PYTHON-VERSION")
def test_python_version(runtime, release, record_property):
    assert "error" not in runtime, f"{release['python']} does not run: {runtime.get('error')}"
    version = runtime["python"]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (3, 10), f"the service venv runs Python {version}"
    record_property("found", f"Python {version}")


@check("RUNTIME-VERSIONS")
def test_runtime_versions(runtime, cfg, record_property):
    assert "error" not in runtime, runtime.get("error")
    problems = []
    for dist, row in runtime["dists"].items():
        want = cfg.pins.get(dist)
        if row["version"] is None:
            problems.append(f"{dist} not installed (pinned {want})")
        elif want and row["version"] != want:
            problems.append(f"{dist} {row['version']} (pinned {want})")
        if row["import"] != "ok":
            problems.append(f"import of {dist} fails: {row['import'][:200]}")
    assert not problems, "; ".join(problems)
    record_property("found", ", ".join(f"{d} {r['version']}" for d, r in runtime["dists"].items()))


@check("MODEL-ARTIFACT")
def test_model_artifact(host, release, record_property):
    python, env = need_release(release)
    model_dir = env.get("VLFLEET_MODEL_DIR")
    assert model_dir, "VLFLEET_MODEL_DIR is not set in vlfleet.env"
    res = run(host, "%s -m service.runtime.manifest verify %s --full", python, model_dir, timeout=600)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"`python -m service.runtime.manifest verify {model_dir} --full` failed (exit {res.rc}): "
                             f"{(res.stderr or res.stdout).strip()[-300:]}") from None
    assert report["ok"], f"{model_dir}: " + "; ".join(report["problems"])
    runtime = report.get("runtime", {})
    record_property("found", f"{report.get('artifact_id')}: every file matches; needs OpenVINO >= "
                             f"{runtime.get('required')}, has {runtime.get('found')}")


@check("TMP-LOCAL")
def test_tmp_local(facts, record_property):
    rows = df_rows(facts["df_tmp"], "/tmp", "/var/tmp")
    remote = [f"{r['path']} is on {r['fstype']} ({r['mount']})" for r in rows
              if r["fstype"] in REMOTE_FS or r["fstype"].startswith("fuse.")]
    small = [f"{r['path']} has {r['avail'] / GiB:.2f} GiB free" for r in rows if r["avail"] < GiB]
    assert not remote and not small, "; ".join(remote + small) + " (needs local, >= 1 GiB free)"
    record_property("found", ", ".join(f"{r['path']} {r['fstype']} {r['avail'] / GiB:.1f} GiB free" for r in rows))


@check("SWAP-ACTIVE")
def test_swap_active(facts, virt, meminfo, artifact, record_property):
    if virt["container"]:
        not_applicable(f"containers cannot enable swap ({virt['what']}); swap belongs to the container host")
    swaps = [ln.split()[0] for ln in facts["swaps"].splitlines() if ln.strip()]
    total, ram = meminfo.get("SwapTotal", 0), meminfo.get("MemTotal", 0)
    assert swaps and total > 0, "no swap is active (/proc/swaps is empty)"
    # The swap role's rule: RAM + swap hold the model's peak plus 1 GiB, and at least 1 GiB of swap (5% slack:
    # /proc/swaps does not count the header page, and RAM reads a little lower than the role saw it).
    need = max(1024, peak_rss_mb(artifact) + 1024 - ram)
    assert total >= 0.95 * need, (f"swap is {total} MiB, needs >= {need} MiB (RAM {ram} MiB + swap must hold the "
                                  f"model's ~{peak_rss_mb(artifact)} MiB peak + 1 GiB)")
    record_property("found", f"{total} MiB swap on {', '.join(swaps)}; RAM {ram} MiB")


@check("MEM-HEADROOM")
def test_mem_headroom(facts, meminfo, artifact, record_property):
    peak = peak_rss_mb(artifact)
    rss = next((int(ln.split()[1]) // 1024 for ln in facts["pid_status"].splitlines() if ln.startswith("VmRSS:")), 0)
    avail, swap_free = meminfo.get("MemAvailable", 0), meminfo.get("SwapFree", 0)
    room = avail + swap_free + rss  # what the service could grow to: what it holds plus what is free
    assert room >= peak + 512, (f"the model needs ~{peak} MiB at peak + 512 MiB spare; available {avail} MiB + free "
                                f"swap {swap_free} MiB + the service's own {rss} MiB = {room} MiB")
    record_property("found", f"room {room} MiB for a ~{peak} MiB peak (available {avail}, swap free {swap_free}, "
                             f"service RSS {rss})")


@check("DISK-FREE")
def test_disk_free(facts, artifact, cfg, record_property):
    models, cache = f"{cfg.root}/models", facts["cache"]
    m, c = df_rows(facts["df_models"], models)[0], df_rows(facts["df_cache"], cache)[0]
    need_models = (artifact["bytes"] or 0) + GiB
    problems = []
    if m["avail"] < need_models:
        problems.append(f"{models} ({m['mount']}) has {m['avail'] / GiB:.2f} GiB free, needs "
                        f"{need_models / GiB:.2f} GiB (one more artifact + 1 GiB)")
    if c["avail"] < GiB:
        problems.append(f"{cache} ({c['mount']}) has {c['avail'] / GiB:.2f} GiB free, needs 1 GiB")
    assert not problems, "; ".join(problems)
    record_property("found", f"models {m['avail'] / GiB:.1f} GiB free, cache {c['avail'] / GiB:.1f} GiB free")


@check("SVC-ENABLED")
def test_service_enabled(unit, cfg, record_property):
    state = unit.get("UnitFileState") or "not installed"
    assert state == "enabled", f"{cfg.service}.service is {state}, not enabled"
    record_property("found", "enabled")


@check("SVC-ACTIVE")
def test_service_active(facts, unit, cfg, record_property):
    state = f"{unit.get('ActiveState')}/{unit.get('SubState')}"
    # Evidence for the operator, as node_exporter's molecule tests do: the last journal lines.
    last = " | ".join(facts["journal"].splitlines()[-3:])
    assert unit.get("ActiveState") == "active", (f"{cfg.service}.service is {state} (result {unit.get('Result')})"
                                                 + (f"; journal: {last[-300:]}" if last else ""))
    record_property("found", f"{state}, pid {unit.get('MainPID')}, {unit.get('NRestarts', '0')} restart(s)")


@check("SVC-RESTART")
def test_service_restart_policy(unit, record_property):
    policy, delay = unit.get("Restart", "no"), unit.get("RestartUSec", "0")
    drop_ins = unit.get("DropInPaths", "").strip()
    where = f" (drop-ins: {drop_ins})" if drop_ins else ""
    assert policy in ("on-failure", "always", "on-abnormal"), f"Restart={policy}{where}"
    assert delay not in ("0", "0s", ""), f"RestartSec={delay}: restarts would spin{where}"
    record_property("found", f"Restart={policy}, RestartSec={delay}")


@check("SVC-NOFILE")
def test_nofile_of_running_process(facts, unit, cfg, record_property):
    pid = main_pid(unit)
    assert facts["pid_limits"], f"/proc/{pid}/limits has no 'Max open files' row (did the process just exit?)"
    soft, hard = facts["pid_limits"].split()[3:5]
    if soft != "unlimited" and int(soft) < cfg.min_nofile:
        drop_ins = unit.get("DropInPaths", "").strip()
        why = f"unit LimitNOFILE={unit.get('LimitNOFILE')}" + (f", drop-ins: {drop_ins}" if drop_ins else "")
        init = (facts["init_limits"].split() or ["unlimited"] * 5)[4]
        if init != "unlimited" and int(init) < cfg.min_nofile:
            # systemd cannot raise a limit above what its own PID 1 got: in a container, the container host's cap.
            why += (f"; PID 1 itself is capped at {init} (hard): raise the limit where PID 1 is started "
                    "(container host: systemd-nspawn --rlimit=NOFILE=65535, or its ulimit -Hn)")
        raise AssertionError(f"pid {pid} may open {soft} files (hard {hard}), needs >= {cfg.min_nofile}; {why}")
    record_property("found", f"pid {pid}: {soft} (hard {hard})")


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    return out


@check("CPU-AFFINITY")
def test_cpu_affinity_matches_plan(facts, unit, record_property):
    pid = main_pid(unit)
    assert facts["plan"], "the launcher's plan (/run/vlfleet/cpu-plan.json) is missing: was the service started " \
                          "by the launcher (ExecStart=... -m service.launcher)?"
    plan = set(json.loads(facts["plan"])["cpus"])
    allowed = next((ln.split(":", 1)[1].strip() for ln in facts["pid_status"].splitlines()
                    if ln.startswith("Cpus_allowed_list:")), "")
    assert _cpus(allowed) == plan, f"pid {pid} may run on CPUs {allowed}, the plan pinned {sorted(plan)}"
    record_property("found", f"pid {pid} on CPUs {allowed} as planned")


@check("NUMA-LOCAL")
def test_service_stays_on_one_numa_node(facts, record_property):
    numa = json.loads(facts["numa"] or "{}")
    nodes = {int(n): _cpus(cpus) for n, cpus in numa.get("nodes", {}).items()}
    if len(nodes) < 2:
        not_applicable(f"{len(nodes) or 1} NUMA node: every CPU reads local memory")
    procs = numa.get("processes") or {}
    assert procs, "no service process to inspect (see SVC-ACTIVE)"
    used = set().union(*(_cpus(cpus) for p in procs.values() for cpus in p["cpus"]))
    home = next((n for n, cpus in sorted(nodes.items()) if cpus and used <= cpus), None)
    assert home is not None, (f"the service's threads may run on CPUs {sorted(used)}, which span NUMA nodes "
                              f"{sorted(n for n, cpus in nodes.items() if cpus & used)}: each reads remote memory")
    # numactl --membind shows as bind:N; "local" is a mapping's own policy (the runtime's allocator sets it: memory
    # of the node the allocating thread runs on), which for threads kept on one node is that node too.
    want = f"bind:{home}"
    on_home = (want, "local", f"prefer:{home}")
    stray = {pid: {k: v for k, v in p["policies"].items() if k not in on_home} for pid, p in procs.items()}
    stray = {pid: other for pid, other in stray.items() if other}
    assert not stray, (f"the threads run on node {home}, but memory is not bound to it ({want}): "
                       + "; ".join(f"pid {pid}: {other}" for pid, other in sorted(stray.items())))
    policies = {k: sum(p["policies"].get(k, 0) for p in procs.values()) for k in on_home}
    assert policies[want], f"no mapping is bound to node {home} ({want}): was the service started through numactl?"
    record_property("found", f"node {home} of {len(nodes)} (CPUs {sorted(used)}); {len(procs)} process(es), memory "
                             + ", ".join(f"{k} on {n} mappings" for k, n in policies.items() if n))


@check("PORT-LISTEN")
def test_port_listens_on_configured_address_only(facts, release, record_property):
    _, env = need_release(release)
    want, port = env.get("VLFLEET_HOST", "127.0.0.1"), int(env.get("VLFLEET_PORT", 8000))
    listeners = {ln.split()[3].rsplit(":", 1)[0].strip("[]") for ln in facts["listen"].splitlines() if ln.strip()}
    assert listeners, f"nothing listens on port {port}"
    wildcard = {"0.0.0.0", "*", "::"}
    expected = wildcard if want in wildcard else {want}
    assert listeners <= expected, f"port {port} is bound on {', '.join(sorted(listeners))}; VLFLEET_HOST is {want}"
    record_property("found", f"{want}:{port} only")


def served_artifact(facts, artifact: dict, engine: str | None) -> tuple[str | None, str]:
    """The artifact id the running engine should serve, and the variable naming it: the llamacpp engine serves
    the GGUF artifact of VLFLEET_LLAMACPP_MODEL_DIR where the env names one."""
    if engine == "llamacpp" and facts.get("gguf_manifest"):
        try:
            return json.loads(facts["gguf_manifest"]).get("artifact_id"), "VLFLEET_LLAMACPP_MODEL_DIR"
        except ValueError:
            return None, "VLFLEET_LLAMACPP_MODEL_DIR"
    return artifact["artifact_id"], "VLFLEET_MODEL_DIR"


@check("SVC-READYZ")
def test_readyz(host, facts, release, artifact, record_property):
    python, env = need_release(release)
    url = readyz_url(env)
    answer = probe(host, python, "readyz", url, timeout=30)
    assert answer["status"] == 200, (f"GET {url} -> {answer['status'] or answer['error']}"
                                     + (f": {json.dumps(answer['body'])[:300]}" if answer["body"] else ""))
    body = answer["body"] or {}
    configured, variable = served_artifact(facts, artifact, body.get("engine"))
    if configured and body.get("artifact_id"):
        assert body["artifact_id"] == configured, (
            f"the service runs artifact {body['artifact_id']}, {variable} holds {configured}: "
            "restart it to load the configured model")
    record_property("found", f"200, model {body.get('model')}, artifact {body.get('artifact_id')}, "
                             f"release {body.get('release_id')}")


@check("SVC-STREAM")
def test_streamed_answer(host, release, cfg, record_property):
    python, env = need_release(release)
    addr, port = service_address(env)
    model = env.get("VLFLEET_MODEL_NAME", "qwen3-vl-2b-instruct")
    args = [addr, port, model, cfg.first_token_timeout, cfg.stream_timeout]
    if env.get("VLFLEET_API_KEYS_FILE"):
        args.append(env["VLFLEET_API_KEYS_FILE"])  # read on the host, as root: the key never leaves it
    out = probe(host, python, "stream", *args, timeout=int(cfg.stream_timeout) + 30)
    assert out["status"] == 200, f"POST /v1/chat/completions -> {out['status']}: {out['error']}"
    assert out["error"] is None, f"the stream broke: {out['error']}"
    assert out["chunks"] > 0, "the stream carried no content delta"
    assert out["done"], "the stream ended without data: [DONE]"
    assert out["total_s"] <= cfg.stream_timeout, f"[DONE] after {out['total_s']} s, bound {cfg.stream_timeout} s"
    record_property("found", f"{out['chunks']} chunk(s), first token {out['first_token_s']} s, [DONE] at "
                             f"{out['total_s']} s")


@check("ENGINE-TUNED")
def test_engine_is_the_tuned_one(host, facts, release, record_property):
    if not facts["tuned"]:
        not_applicable(f"never tuned: no {TUNED_FILE} (`vlfleet tune` writes it); the service runs the "
                       "release's VLFLEET_ENGINE")
    try:
        tuned = json.loads(facts["tuned"])
        want = tuned["engine"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{TUNED_FILE} is not a tune record: {facts['tuned'][:200]}") from None
    python, env = need_release(release)
    answer = probe(host, python, "readyz", readyz_url(env), timeout=30)
    running = (answer["body"] or {}).get("engine") if isinstance(answer["body"], dict) else None
    assert running, f"/readyz does not name the engine (release {release['target']} predates it): {answer}"
    assert running == want, (f"the service runs {running}; `vlfleet tune` chose {want} on {tuned.get('time')} "
                             f"({tuned.get('why', '')})")
    record_property("found", f"{running}, as tuned on {tuned.get('time')}: {tuned.get('why', '')}")


@check("CLOCK-SYNC")
def test_clock_synchronised(facts, virt, record_property):
    if virt["container"]:
        not_applicable(f"a container shares its host's kernel clock ({virt['what']}); check time sync on that host")
    state = keyvalues(facts["time"])
    assert "NTPSynchronized" in state, f"timedatectl cannot tell: {facts['time'][:200]}"
    assert state["NTPSynchronized"] == "yes", (
        f"clock not synchronised (NTP service {'on' if state.get('NTP') == 'yes' else 'off'})")
    record_property("found", "NTP synchronised")

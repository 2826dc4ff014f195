"""site.yml on the staging fleet (2 nspawn containers + 1 qemu VM in `vlm`, nginx container in `lb`).

The session's converge (the first run, shared with every later e2e module), a second run and a --check run are
shared by the module (they are the expensive part); each test then asserts one fact about the converged fleet, over
real SSH and real HTTP.
"""

from __future__ import annotations

import http.client
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.hostcmd import service_pids
from tests.e2e.hostcmd import ssh as _ssh
from tests.e2e.hostcmd import sudo as _sudo
from tests.e2e.site_vars import CONVERGE_TIMEOUT, converge, site_vars

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

# What the tests print and what the closing note quotes: per-role wall time of each run.
PROFILE_FILE = "site-profile.json"


def _print_profile(label: str, run) -> None:
    roles = ", ".join(f"{r} {s:.1f}s" for r, s in sorted(run.roles.items(), key=lambda kv: -kv[1]))
    print(f"\n[site] {label}: {run.duration:.1f} s; per role: {roles}\n{run.summary()}")


@pytest.fixture(scope="module")
def hosts(staging_fleet) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return hosts_of(Path(staging_fleet.inventory_path))


# The roles whose work differs on a real kernel (the VM) from a container's: the VM's second run is limited to them.
KERNEL_ROLES = ("cpu_check", "swap", "limits", "cpu_tuning")


@pytest.fixture(scope="module")
def converged(converged_inventory, tiny_model: Path, tmp_path_factory):
    """First run (the session's shared converge), then a second run and a --check run of site.yml.

    Every task costs seconds on the emulated VM (SSH, sudo and a Python start under TCG), so after the first run
    the VM gets only the roles a real kernel changes (KERNEL_ROLES: its swap file, limits, sysfs), in a run beside
    the containers' and the lb's, which get the whole playbook twice: a second run and a --check run. The other
    roles run the same host program and templates on every kind of host."""
    from ops.playbook import run_playbook

    inventory = converged_inventory
    extra = site_vars(tiny_model)
    first = converge(inventory, tiny_model)
    _print_profile("first run", first)
    vms, others = _vms_and_others(inventory)

    def containers() -> tuple:
        second = run_playbook(inventory, "site.yml", extra, limit=others, timeout=CONVERGE_TIMEOUT, echo=None)
        return second, run_playbook(inventory, "site.yml", extra, check=True, diff=True, limit=others,
                                    timeout=CONVERGE_TIMEOUT, echo=None)

    with ThreadPoolExecutor(1) as pool:
        containers_runs = pool.submit(containers)
        vm_second = run_playbook(inventory, "site.yml", extra, limit=vms, tags=KERNEL_ROLES,
                                 timeout=CONVERGE_TIMEOUT, echo=None)
        second, check = containers_runs.result()
    runs = {"first": first, "second": second, "vm_second": vm_second, "check": check}
    for name, run in runs.items():
        _print_profile(f"{name} run", run)
    out = tmp_path_factory.mktemp("site") / PROFILE_FILE
    out.write_text(json.dumps({name: {"duration": r.duration, "roles": r.roles, "recap": r.recap}
                               for name, r in runs.items()}, indent=1))
    print(f"[site] profile written to {out}")
    return runs


def _vms_and_others(inventory: Path) -> tuple[str, str]:
    """The inventory's VMs and its other hosts, each as an Ansible --limit."""
    from ops.staging.inventory import hosts_of

    hosts = hosts_of(inventory)
    vms = [name for name, h in hosts.items() if h.get("vlfleet_staging_kind") == "vm"]
    return ",".join(vms), ",".join(name for name in hosts if name not in vms)


def _vlm(hosts: dict[str, dict]) -> dict[str, dict]:
    return {name: h for name, h in hosts.items() if "vlm" in h["groups"]}


def _lb(hosts: dict[str, dict]) -> dict:
    return next(h for h in hosts.values() if "lb" in h["groups"])


def _stream_chat(address: str, port: int) -> tuple[int, list[str]]:
    """POST a streamed chat request; return the status and the content deltas received."""
    body = json.dumps({"model": "qwen3-vl-2b-instruct", "stream": True, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hello."}]})
    conn = http.client.HTTPConnection(address, port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Type", "").startswith("text/event-stream"), resp.getheader("Content-Type")
        deltas, done = [], False
        for _ in range(10_000):  # bounded: 8 tokens give a few dozen lines
            line = resp.readline()
            if not line:
                break
            text = line.decode().strip()
            if text == "data: [DONE]":
                done = True
                break
            if text.startswith("data: "):
                chunk = json.loads(text[6:])
                deltas += [c["delta"].get("content", "") for c in chunk.get("choices", [])]
        assert done, "stream ended without data: [DONE]"
        return resp.status, deltas
    finally:
        conn.close()


def test_site_converges_every_host(converged, hosts):
    first = converged["first"]
    for name in hosts:
        assert name in first.recap, f"{name} missing from the recap"
        assert first.recap[name]["failures"] == 0 and first.recap[name]["unreachable"] == 0, first.summary()


def test_every_host_answers_a_streamed_chat(converged, hosts):
    for name, host in _vlm(hosts).items():
        status, deltas = _stream_chat(host["ansible_host"], 8000)
        assert status == 200, name
        assert len(deltas) >= 2, f"{name}: too few chunks: {deltas}"


def test_nginx_streams_chat_from_the_fleet(converged, hosts):
    lb = _lb(hosts)
    for _ in range(len(_vlm(hosts))):
        status, deltas = _stream_chat(lb["ansible_host"], 80)
        assert status == 200 and len(deltas) >= 2
    site = _sudo(lb, "cat /etc/nginx/sites-enabled/vlfleet")
    for host in _vlm(hosts).values():
        assert f"server {host['ansible_host']}:8000 " in site
    assert "proxy_buffering off;" in site


@pytest.mark.parametrize("run", ["second", "vm_second"])
def test_second_run_changes_nothing(converged, run):
    second = converged[run]
    assert second.ok, second.summary()
    assert set(second.recap) >= ({"c1", "c2", "lb1"} if run == "second" else {"vm1"}), second.recap
    changed = {h: n["changed"] for h, n in second.recap.items() if n["changed"]}
    assert not changed, f"{run} run changed {changed}: {second.changed}"


def test_check_mode_on_converged_fleet_reports_no_changes(converged):
    check = converged["check"]
    assert check.ok, check.summary()
    assert {"c1", "c2", "lb1"} <= set(check.recap), check.recap  # the hosts it ran on
    changed = {h: n["changed"] for h, n in check.recap.items() if n["changed"]}
    assert not changed, f"--check would change {changed}: {check.changed}"


def test_a_roles_tag_runs_alone(converged, converged_inventory, tiny_model: Path):
    # The remediations say `vlfleet site ... --tags vlm_service`: the facts other roles read (the release, the
    # artifact) must be named on such a run too, not only when python_runtime's and model_artifact's tags run.
    from ops.playbook import run_playbook

    run = run_playbook(converged_inventory, "site.yml", site_vars(tiny_model), tags=["os_packages", "vlm_service"],
                       limit="c1,lb1", timeout=CONVERGE_TIMEOUT, echo=None)
    assert run.ok, run.summary()
    changed = {h: n["changed"] for h, n in run.recap.items() if n["changed"]}
    assert not changed, f"--tags os_packages,vlm_service changed {changed}: {run.changed}"


def test_service_has_65535_open_files(converged, hosts):
    import resource

    # A container's PID 1 inherits the controller's hard limit (20000 on some sandboxes, which cannot raise it),
    # and the unit's LimitNOFILE is clamped to it; a VM or real host gets the full 65535.
    controller_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for name, host in _vlm(hosts).items():
        want = 65535 if host.get("vlfleet_staging_kind") == "vm" else min(65535, controller_hard)
        main_pid = int(_sudo(host, "systemctl show -p MainPID --value vlfleet.service").strip())
        assert main_pid > 0, name
        for pid in {main_pid, *service_pids(host)}:
            limits = _sudo(host, f"cat /proc/{pid}/limits")
            expected = rf"^Max open files\s+{want}\s+{want}\s+files"
            assert re.search(expected, limits, re.M), f"{name} pid {pid}:\n{limits}"


def test_service_affinity_equals_launcher_plan(converged, hosts):
    from service.launcher import parse_cpu_list

    for name, host in _vlm(hosts).items():
        plan = json.loads(_sudo(host, "cat /run/vlfleet/cpu-plan.json"))
        assert plan["threads"] == len(plan["cpus"]) >= 1, plan
        env = _sudo(host, "cat /opt/vlfleet/current/vlfleet.env")
        assert "VLFLEET_THREADS" not in env  # the launcher sets it from the plan
        for pid in service_pids(host):
            status = _sudo(host, f"cat /proc/{pid}/status")
            allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)
            assert sorted(parse_cpu_list(allowed)) == plan["cpus"], f"{name} pid {pid}: {allowed} vs {plan}"
            environ = _sudo(host, f"tr '\\0' '\\n' < /proc/{pid}/environ")
            assert f"VLFLEET_THREADS={plan['threads']}" in environ.splitlines(), name


def test_swap_active_on_vm_and_not_applicable_in_containers(converged, hosts):
    output = converged["first"].output
    for name, host in _vlm(hosts).items():
        swaps = _sudo(host, "cat /proc/swaps")
        if host["vlfleet_staging_kind"] == "vm":
            assert "/swapfile" in swaps, f"{name}: {swaps}"
            assert "/swapfile none swap sw 0 0" in _sudo(host, "cat /etc/fstab")
            assert _sudo(host, "cat /proc/sys/vm/swappiness").strip() == "10"
        else:
            assert "/swapfile" not in swaps
            assert re.search(rf'ok: \[{name}\] => {{\s*"msg": "not applicable: containers cannot enable swap',
                             output), f"{name}: no 'not applicable' report in the run output"


def test_unit_exposure_at_most_3(converged, hosts):
    for name, host in _vlm(hosts).items():
        report = _sudo(host, "systemd-analyze security --no-pager vlfleet.service")
        level = float(re.search(r"Overall exposure level for vlfleet.service: ([0-9.]+)", report).group(1))
        print(f"[site] {name}: systemd-analyze security exposure {level}")
        assert level <= 3.0, report


def test_release_layout_and_modes(converged, hosts):
    for name, host in _vlm(hosts).items():
        current = _sudo(host, "readlink /opt/vlfleet/current").strip()
        assert re.fullmatch(r"/opt/vlfleet/releases/[0-9a-f]{12}", current), f"{name}: {current}"
        assert _sudo(host, f"stat -c '%a %U:%G' {current}/vlfleet.env").split() == ["640", "root:vlfleet"]
        model_dir = re.search(r"^VLFLEET_MODEL_DIR=(.*)$", _sudo(host, f"cat {current}/vlfleet.env"), re.M).group(1)
        writable = _sudo(host, f"find {model_dir} -perm /222 | head -3").strip()
        assert not writable, f"{name}: writable files in the artifact: {writable}"
        verify = _ssh(host, f"{current}/venv/bin/python -m service.runtime.manifest verify --full {model_dir}")
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_host_without_avx2_stops_at_cpu_check(noavx2_fleet, tiny_model: Path):
    from ops.playbook import run_playbook
    from ops.staging.inventory import hosts_of

    inventory = Path(noavx2_fleet.inventory_path)
    (name, host), = hosts_of(inventory).items()
    assert "avx2" not in _sudo(host, "grep -m1 '^flags' /proc/cpuinfo").split()
    run = run_playbook(inventory, "site.yml", site_vars(tiny_model), timeout=900)
    assert not run.ok
    failures = run.failed.get(name, [])
    assert len(failures) == 1 and "cpu-01" in failures[0]["task"], failures
    model = re.search(r"^model name\s*:\s*(.*)$", _sudo(host, "cat /proc/cpuinfo"), re.M).group(1).strip()
    assert f"cpu_check failed on {name}: CPU '{model}' lacks avx2." in failures[0]["msg"], failures[0]["msg"]
    assert "Nothing was installed on this host" in failures[0]["msg"]
    # Nothing was installed: no tree, no user, no fact file, no swap file, no unit.
    leftovers = _ssh(host, "ls -d /opt/vlfleet /etc/ansible/facts.d /swapfile /etc/systemd/system/vlfleet.service "
                           "/etc/security/limits.d/90-vlfleet.conf 2>/dev/null; getent passwd vlfleet")
    assert leftovers.stdout.strip() == "", leftovers.stdout
    assert run.changed.get(name, []) == []

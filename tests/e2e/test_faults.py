"""Faults on the staging fleet, each followed by its recovery: what breaks, what the fleet does by itself, how long
it takes. Every test puts back what it broke (the fleet is shared by the e2e modules); the measuring ones keep their
times as `faults-*.json` reports (tests/reports.py), from which docs/reliability.md's figures are generated: each
records after its assertions, and tests/reports.py writes a report only for a test that passed.

  kill -9 of the service's main process        systemd restarts it; /readyz 200 again within KILL_BOUND_S
  vm1 reboots (guest `systemctl reboot`)       swap, limits and the service come back; the checklist passes
  c2 powers off in the middle of its rollout   reported per host; max-fail 0 stops the rollout; later hosts
                                               untouched
  a model file on c2 corrupted                 the service refuses to start (journal names the check), the
                                               checklist names the file, nginx on lb1 keeps serving from the rest
  disk full during a convert (controller)      a clear failure, no partial artifact
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ops.staging.fleet import power_cycle
from ops.staging.fleet import status as staging_status
from tests.e2e.hostcmd import ssh as _ssh
from tests.e2e.hostcmd import sudo as _sudo
from tests.e2e.site_vars import converge
from tests.e2e.waivers import staging_waivers
from tests.prereq import require_tools
from tests.reports import record

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

KILL_BOUND_S = 180  # generous: model load on a busy 2-core controller; the measured time is printed
READY_TIMEOUT = 900  # a TCG VM loading the model after a cold boot
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


# -- talking to hosts ------------------------------------------------------------------------------------------


def _readyz(address: str, port: int = 8000, timeout: float = 5) -> int:
    """Status of GET /readyz straight from the controller (the service binds the host's fleet address)."""
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def _poll(predicate, timeout: float, what: str, interval: float = 1.0) -> float:
    """Seconds until ``predicate()`` held; fails the test after ``timeout`` (bounded loop)."""
    started = time.monotonic()
    for _ in range(int(timeout / interval) + 1):
        try:
            if predicate():
                return time.monotonic() - started
        except (OSError, subprocess.SubprocessError, AssertionError):
            pass  # the host is still on its way back
        if time.monotonic() - started > timeout:
            break
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def _main_pid(host: dict) -> int:
    return int(_sudo(host, "systemctl show -p MainPID --value vlfleet.service").strip() or 0)


def _chat_through(address: str, port: int, n: int) -> int:
    body = json.dumps({"messages": [{"role": "user", "content": f"Fault drill request {n}."}], "max_tokens": 4})
    conn = http.client.HTTPConnection(address, port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"{}")
        return resp.status if resp.status != 200 or data["usage"]["completion_tokens"] >= 1 else -1
    finally:
        conn.close()


def _record(name: str, data: dict) -> None:
    record(f"faults-{name}", data)


# -- the fleet -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inventory(request, tiny_model: Path) -> Path:
    """The e2e fleet, converged by the session's shared site.yml run.

    VLFLEET_FAULTS_INVENTORY=PATH runs these against another staging fleet (made by `vlfleet staging.up`).
    """
    given = os.environ.get("VLFLEET_FAULTS_INVENTORY")
    if not given:
        return request.getfixturevalue("converged_inventory")
    converge(Path(given), tiny_model)
    return Path(given)


@pytest.fixture(scope="module")
def hosts(inventory) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return hosts_of(inventory)


def _vlm(hosts: dict[str, dict]) -> list[str]:
    """Service hosts in inventory order (the rollout's order: the first is the canary)."""
    return [name for name, h in hosts.items() if "vlm" in h["groups"]]


def _lb(hosts: dict[str, dict]) -> dict:
    return next(h for h in hosts.values() if "lb" in h["groups"])


def _fleet_name(inventory: Path) -> str:
    import yaml

    return yaml.safe_load(inventory.read_text())["all"]["vars"]["vlfleet_staging_fleet"]


def _checklist(inventory: Path, host: str, tmp: Path):
    from ops.preflight.runner import Options, run_host
    from ops.staging.inventory import hosts_of

    waivers = staging_waivers(hosts_of(inventory), tmp / "waivers.yml")
    return run_host(host, inventory, Options(waivers=str(waivers)), tmp)


def _halt(host: dict, verb: str) -> None:
    """`systemctl poweroff|reboot` on the host; its SSH session may die before (or without) an answer."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        _ssh(host, f"sudo systemctl {verb}", timeout=30)


def _wait_ssh(host: dict, timeout: float) -> float:
    return _poll(lambda: _ssh(host, "true", timeout=20).returncode == 0, timeout, f"SSH on {host['ansible_host']}",
                 interval=3)


# -- kill -9 ---------------------------------------------------------------------------------------------------


def test_kill_9_of_the_service_is_restarted_by_systemd(inventory, hosts):
    c1 = hosts["c1"]
    assert _readyz(c1["ansible_host"]) == 200
    before = _main_pid(c1)
    restarts = int(_sudo(c1, "systemctl show -p NRestarts --value vlfleet.service").strip())
    assert before > 0
    _sudo(c1, f"kill -9 {before}")
    t0 = time.monotonic()
    back = _poll(lambda: _main_pid(c1) not in (0, before), 60, "systemd to start a new main process", 0.5)
    ready = _poll(lambda: _readyz(c1["ansible_host"]) == 200, KILL_BOUND_S, "/readyz 200 after kill -9", 0.5)
    total = time.monotonic() - t0
    assert int(_sudo(c1, "systemctl show -p NRestarts --value vlfleet.service").strip()) == restarts + 1
    journal = _sudo(c1, "journalctl -u vlfleet.service --since '-10min' --no-pager -o cat")
    assert "status=9/KILL" in journal and "Scheduled restart job" in journal, journal[-2000:]
    assert ready <= KILL_BOUND_S
    _record("kill9", {"host": "c1", "new_pid_after_s": round(back, 1), "ready_after_s": round(total, 1),
                      "bound_s": KILL_BOUND_S})


# -- VM reboot -------------------------------------------------------------------------------------------------


def test_vm_reboot_brings_swap_limits_and_service_back(inventory, hosts, tmp_path):
    vms = [n for n in _vlm(hosts) if hosts[n]["vlfleet_staging_kind"] == "vm"]
    if not vms:
        pytest.skip("this fleet has no VM host (VLFLEET_FAULTS_INVENTORY points at a containers-only fleet)")
    vm1 = hosts[vms[0]]
    _sudo(vm1, "test -n \"$(tail -n +2 /proc/swaps)\"")  # swap on before the reboot
    boot_id = _sudo(vm1, "cat /proc/sys/kernel/random/boot_id").strip()
    _halt(vm1, "reboot")
    t0 = time.monotonic()
    power_cycle(_fleet_name(inventory), vms[0])
    _wait_ssh(vm1, 900)
    ssh_s = time.monotonic() - t0
    _poll(lambda: _readyz(vm1["ansible_host"]) == 200, READY_TIMEOUT, "vm1 /readyz 200 after the reboot", 3)
    ready_s = time.monotonic() - t0
    assert _sudo(vm1, "cat /proc/sys/kernel/random/boot_id").strip() != boot_id, "vm1 did not reboot"
    assert "/swapfile" in _sudo(vm1, "cat /proc/swaps")
    assert _sudo(vm1, "cat /proc/sys/vm/swappiness").strip() == "10"
    pid = _main_pid(vm1)
    assert re.search(r"^Max open files\s+65535\s+65535", _sudo(vm1, f"cat /proc/{pid}/limits"), re.M)
    report = _checklist(inventory, vms[0], tmp_path)
    assert report.failed_ids(vms[0]) == [], [(r.id, r.message) for r in report.results if r.status == "fail"]
    assert report.exit_code == 0
    _record("vm-reboot", {"host": vms[0], "ssh_after_s": round(ssh_s, 1), "ready_after_s": round(ready_s, 1),
                          "checklist_failed": report.failed_ids(vms[0])})


# -- a host that goes down mid-rollout -------------------------------------------------------------------------


def _releases(inventory: Path) -> dict[str, tuple[str | None, bool]]:
    from ops import fleet as ops_fleet
    from ops.fleet import Fleet, Timeouts, load_inventory

    with Fleet(load_inventory(inventory), timeouts=Timeouts(drain=30, ready=READY_TIMEOUT), echo=None) as f:
        return {r["host"]: (r.get("serving"), bool(r.get("ready"))) for r in ops_fleet.status(f)}


def test_host_down_in_the_middle_of_its_rollout_batch(inventory, hosts):
    from ops import fleet as ops_fleet
    from ops.fleet import Fleet, Outcome, Release, Timeouts, load_inventory

    canary, victim, *rest = _vlm(hosts)  # batches of one: canary, then the host that goes down, then the rest
    assert rest, "needs three service hosts"
    start = _releases(inventory)
    assert all(ready for _release, ready in start.values()), start
    new = f"faults-{int(time.time())}"
    fleet = _fleet_name(inventory)
    downed = threading.Event()

    class PowerOffWhileStaging(Fleet):
        """The victim goes down after its step has described it and before staging runs: a real poweroff, then
        waiting until its container or VM process is gone, so the step cannot race past it on a fast host."""

        def step(self, name, command, args, timeout=None, lock=None):
            if name == victim and command == "stage" and not downed.is_set():
                _halt(hosts[victim], "poweroff")
                _poll(lambda: not staging_status(fleet)["hosts"][victim]["running"], 180, f"{victim} to power off")
                downed.set()
            return super().step(name, command, args, timeout=timeout, lock=lock)

    lines: list[str] = []

    def echo(line: str) -> None:
        print(line)
        lines.append(line)

    with PowerOffWhileStaging(load_inventory(inventory), timeouts=Timeouts(drain=30, ready=READY_TIMEOUT,
                                                                         command=120), echo=echo) as f:
        report = ops_fleet.rollout(f, Release(new), batch="1", max_fail=0)
    print("\n" + report.table())
    by_host = {r.host: r for r in report.results}
    try:
        assert downed.is_set(), f"{victim} was never powered off: the rollout did not reach it"
        assert by_host[canary].outcome is Outcome.OK, report.table()
        assert by_host[victim].outcome in (Outcome.UNREACHABLE, Outcome.FAILED), report.table()
        assert by_host[victim].message, f"no reason reported for {victim}"
        assert [by_host[h].outcome for h in rest] == [Outcome.SKIPPED] * len(rest), report.table()
        assert report.stopped and "--max-fail 0" in report.stopped, report.stopped
        assert any(f"{victim}: {by_host[victim].outcome.value}" in ln for ln in lines), lines
        now = _releases(inventory)
        assert {h: now[h] for h in rest} == {h: start[h] for h in rest}, "a host after the stop changed"
        assert now[canary] == (new, True)
    finally:
        restored = _restore_after_rollout(inventory, hosts, victim, start)
    _record("host-down-mid-rollout", {"host": victim, "outcome": by_host[victim].outcome.value,
                                      "message": by_host[victim].message, "stopped": report.stopped,
                                      "rollout_s": report.seconds, **restored})


def _restore_after_rollout(inventory: Path, hosts: dict, victim: str, start: dict) -> dict:
    """Power the victim on again, back in nginx, and every host on the release it started with."""
    from ops import fleet as ops_fleet
    from ops.fleet import Fleet, Timeouts, load_inventory

    t0 = time.monotonic()
    power_cycle(_fleet_name(inventory), victim)
    _wait_ssh(hosts[victim], 300)
    _poll(lambda: _readyz(hosts[victim]["ansible_host"]) == 200, READY_TIMEOUT, f"{victim} ready after power-on", 2)
    back_s = time.monotonic() - t0
    target = {release for release, _ready in start.values()}
    assert len(target) == 1, start
    with Fleet(load_inventory(inventory), timeouts=Timeouts(drain=30, ready=READY_TIMEOUT), echo=print) as f:
        f.set_drained([], list(start))  # the victim may have gone down while drained
        report = ops_fleet.rollback(f, to=target.pop(), batch="100%", max_fail="100%")
    assert report.ok, report.table()
    assert _releases(inventory) == start
    return {"serving_again_after_power_on_s": round(back_s, 1)}


# -- corrupted artifact ----------------------------------------------------------------------------------------


@pytest.fixture
def corrupt_c2(inventory, hosts):
    """Yields a function that corrupts c2's largest model file (``how``: 'flip' keeps the size, 'truncate' drops
    the last byte) and restarts the service; afterwards the file is copied back and the service restarted."""
    c2 = hosts["c2"]
    env = _sudo(c2, "cat /opt/vlfleet/current/vlfleet.env")
    model_dir = re.search(r"^VLFLEET_MODEL_DIR=(.*)$", env, re.M).group(1)
    target = _sudo(c2, f"ls -S {model_dir}/*.bin | head -n1").strip()
    backup = "/root/faults-model-backup.bin"
    _sudo(c2, f"cp -a {target} {backup}")
    flip = ("python3 -c \"import sys; f = open(sys.argv[1], 'r+b'); f.seek(4096); b = f.read(1); f.seek(4096); "
            "f.write(bytes([b[0] ^ 0xFF])); f.close()\" " + target)

    def corrupt(how: str) -> dict:
        since = _sudo(c2, "date +%s").strip()  # journal lines of this restart only, not of an earlier test's
        _sudo(c2, flip if how == "flip" else f"truncate -s -1 {target}")
        _sudo(c2, "systemctl restart vlfleet.service")
        return {"file": target, "dir": model_dir, "since": since}

    try:
        yield corrupt
    finally:
        _sudo(c2, f"cp -a {backup} {target} && rm -f {backup} && systemctl reset-failed vlfleet.service; "
                  "systemctl restart vlfleet.service")
        _poll(lambda: _readyz(c2["ansible_host"]) == 200, READY_TIMEOUT, "c2 ready after restoring the file", 2)


def _journal_since(host: dict, since: str) -> str:
    return _sudo(host, f"journalctl -u vlfleet.service --since @{since} --no-pager -o cat")


def _wait_refusal_or_ready(host: dict, since: str, timeout: float = 300) -> str:
    """'refused' once the journal shows the artifact check failing, 'ready' if /readyz turns 200 instead."""
    outcome: list[str] = []

    def settled() -> bool:
        if "model artifact check" in _journal_since(host, since):
            outcome.append("refused")
        elif _readyz(host["ansible_host"]) == 200:
            outcome.append("ready")
        return bool(outcome)

    _poll(settled, timeout, "the service to refuse the artifact or to become ready", 2)
    return outcome[0]


def test_truncated_model_file_service_refuses_checklist_names_it_lb_serves(inventory, hosts, corrupt_c2, tmp_path):
    c2, lb = hosts["c2"], _lb(hosts)
    t0 = time.monotonic()
    broken = corrupt_c2("truncate")
    assert _wait_refusal_or_ready(c2, broken["since"]) == "refused"
    refused_s = time.monotonic() - t0
    rel = Path(broken["file"]).relative_to(broken["dir"]).as_posix()
    journal = _journal_since(c2, broken["since"])
    assert f"model artifact check 'file-sizes' failed for {broken['dir']}" in journal, journal[-2000:]
    assert rel in journal and "Fix:" in journal
    assert _readyz(c2["ansible_host"]) != 200
    # The other hosts keep serving through nginx: every request through lb1 succeeds.
    statuses = [_chat_through(lb["ansible_host"], 80, n) for n in range(6)]
    assert statuses == [200] * 6, statuses
    report = _checklist(inventory, "c2", tmp_path)
    artifact = report.get("c2", "MODEL-ARTIFACT")
    assert artifact.status == "fail" and rel in artifact.message, artifact
    _record("corrupt-artifact", {"host": "c2", "file": rel, "refused_after_s": round(refused_s, 1),
                                 "lb_statuses": statuses, "checklist": artifact.message[:200]})


def test_flipped_byte_in_model_file_service_refuses_to_start(inventory, hosts, corrupt_c2):
    c2 = hosts["c2"]
    broken = corrupt_c2("flip")
    assert _wait_refusal_or_ready(c2, broken["since"]) == "refused"
    rel = Path(broken["file"]).relative_to(broken["dir"]).as_posix()
    journal = _journal_since(c2, broken["since"])
    # Same size, so the size check passes: the hash gate must be the one that refuses, naming the file.
    assert f"model artifact check 'file-hashes' failed for {broken['dir']}" in journal, journal[-2000:]
    assert f"{rel}: sha256 differs from the manifest" in journal, journal[-2000:]
    assert _readyz(c2["ansible_host"]) != 200


# -- disk full during a convert --------------------------------------------------------------------------------


def test_disk_full_during_convert_leaves_no_partial_artifact(tiny_checkpoint: Path, tmp_path):
    require_tools("mount", "umount", root=True)
    mnt = tmp_path / "small"
    mnt.mkdir()
    # Smaller than the tiny artifact (~2 MB): the export runs out of space while writing it.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        out = mnt / "artifact"
        t0 = time.monotonic()
        done = subprocess.run([str(BIN / "vlfleet"), "model.convert", "--source", str(tiny_checkpoint), "--out",
                               str(out), "--weight-format", "int4", "--group-size", "16"], cwd=REPO,
                              capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        seconds, output = time.monotonic() - t0, done.stdout + done.stderr
        assert done.returncode != 0
        assert "No space left on device" in output, output[-3000:]
        assert "no artifact was written" in output.strip().splitlines()[-1], output[-1000:]
        assert "Traceback" not in output.split("optimum-cli export failed")[-1]  # our own message, not a traceback
        assert not out.exists()
        assert [p.name for p in mnt.iterdir() if not p.name.endswith(".lock")] == [], list(mnt.iterdir())
        _record("disk-full-convert", {"exit": done.returncode, "seconds": round(seconds, 1),
                                      "last_line": output.strip().splitlines()[-1]})
    finally:
        subprocess.run(["umount", str(mnt)], timeout=60)

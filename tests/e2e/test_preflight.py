"""The pre-launch checklist against the staging fleet: healthy hosts pass; hosts broken on purpose are reported
with exactly the right ids and remediation, by `vlfleet preflight`, by plain pytest and by the preflight role.

Broken on purpose (one fixture, restored afterwards: other e2e tests share the fleet):
  c1: vlfleet.service stopped                       -> SVC-ACTIVE (its dependents blocked)
  c2: one byte of a model file changed (same size)  -> MODEL-ARTIFACT, naming the file
  vm1: swap off, LimitNOFILE=1024 via a drop-in     -> SWAP-ACTIVE, SVC-NOFILE; CPU-GOVERNOR n/a (no cpufreq on a VM)

Dev loop: VLFLEET_KEEP_FLEET=1 keeps the fleet; then VLFLEET_E2E_CONVERGED=1 skips the session's site.yml converge.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.preflight import registry
from ops.preflight.results import ChecklistRun
from tests.e2e.hostcmd import ssh as _ssh
from tests.e2e.hostcmd import sudo as _sudo
from tests.e2e.waivers import staging_waivers, without_avx512

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 1200
DROP_IN = "/etc/systemd/system/vlfleet.service.d/50-preflight-e2e-nofile.conf"
BROKEN = {"c1": ["SVC-ACTIVE"], "c2": ["MODEL-ARTIFACT"], "vm1": ["SWAP-ACTIVE", "SVC-NOFILE"]}


def _wait_ready(host: dict, timeout: float = 600) -> None:
    # Bounded: one probe every 5 s until the deadline, over the host's own loopback view of its address.
    env = _sudo(host, "cat /opt/vlfleet/current/vlfleet.env")
    kv = dict(ln.split("=", 1) for ln in env.splitlines() if "=" in ln and not ln.startswith("#"))
    url = f"http://{kv['VLFLEET_HOST']}:{kv['VLFLEET_PORT']}/readyz"
    probe = ("/opt/vlfleet/current/venv/bin/python -c \"import urllib.request,sys; "
             f"sys.exit(0 if urllib.request.urlopen('{url}', timeout=10).status == 200 else 1)\"")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ssh(host, probe, timeout=30).returncode == 0:
            return
        time.sleep(5)
    pytest.fail(f"{host['ansible_host']}: /readyz not 200 within {timeout:.0f} s")


@pytest.fixture(scope="module")
def hosts(staging_fleet) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return {n: h for n, h in hosts_of(Path(staging_fleet.inventory_path)).items() if "vlm" in h["groups"]}


@pytest.fixture(scope="module")
def inventory(converged_inventory) -> Path:
    """The e2e fleet, converged by the session's shared site.yml run."""
    return converged_inventory


@pytest.fixture(scope="module")
def waivers_file(hosts, tmp_path_factory) -> Path:
    """What staging cannot provide, waived with the reason (CPU-AVX512 only where the host's CPU lacks it)."""
    return staging_waivers(hosts, tmp_path_factory.mktemp("preflight") / "waivers.yml")


def _vlfleet_preflight(inventory: Path, waivers: Path, out: Path) -> tuple[subprocess.CompletedProcess, ChecklistRun]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run([str(BIN / "vlfleet"), "preflight", "--inventory", str(inventory), "--waivers", str(waivers),
                           "--json", str(out / "report.json"), "--junit", str(out / "report.xml"),
                           "--logs", str(out / "hosts")], cwd=REPO, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    print(f"\n[preflight] vlfleet preflight took {time.monotonic() - started:.1f} s (exit {done.returncode})\n"
          + done.stdout + done.stderr)
    return done, ChecklistRun.from_json(json.loads((out / "report.json").read_text()))


def _expect(report: ChecklistRun, broken: dict[str, list[str]]) -> None:
    for host in ("c1", "c2", "vm1"):
        assert report.failed_ids(host) == broken.get(host, []), f"{host}: {report.failed_ids(host)}"


def test_healthy_fleet_is_ready(inventory, hosts, waivers_file, tmp_path):
    done, report = _vlfleet_preflight(inventory, waivers_file, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "READY: 3 host(s)" in done.stdout
    _expect(report, {})
    na = {(r.host, r.id) for r in report.results if r.status == "n/a"}
    # ENGINE-TUNED: the shared fleet is never left tuned (tests/e2e/test_tune.py puts c1 back). NUMA-LOCAL:
    # containers see the controller's nodes; vm1 has two (tests/e2e/conftest.py).
    one_node = len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) < 2
    assert na == {("c1", "CPU-GOVERNOR"), ("c1", "SWAP-ACTIVE"), ("c1", "CLOCK-SYNC"), ("c2", "CPU-GOVERNOR"),
                  ("c2", "SWAP-ACTIVE"), ("c2", "CLOCK-SYNC"), ("vm1", "CPU-GOVERNOR"),
                  *((h, "ENGINE-TUNED") for h in ("c1", "c2", "vm1")),
                  *((h, "NUMA-LOCAL") for h in ("c1", "c2") if one_node)}
    assert {r.status for r in report.results} <= {"pass", "n/a", "waived"}
    assert all(report.get(h, c) for h in ("c1", "c2", "vm1") for c in registry.ids()), "a check is missing"
    no_avx512 = set(without_avx512(hosts))
    for host in ("c1", "c2", "vm1"):  # the check follows the CPU the host really has
        assert report.get(host, "CPU-AVX512").status == ("waived" if host in no_avx512 else "pass"), host
    stream = report.get("vm1", "SVC-STREAM")
    assert stream.status == "pass" and "[DONE]" in stream.message
    numa = report.get("vm1", "NUMA-LOCAL")
    assert numa.status == "pass", numa.message
    assert re.search(r"^node (\d) of 2 .* memory bind:\1 on \d+ mappings", numa.message), numa.message


@pytest.fixture(scope="class")
def broken(inventory, hosts):
    """Break c1, c2 and vm1 as the module docstring says; put everything back afterwards and wait for ready."""
    c1, c2, vm1 = hosts["c1"], hosts["c2"], hosts["vm1"]
    model_dir = dict(ln.split("=", 1) for ln in _sudo(c2, "cat /opt/vlfleet/current/vlfleet.env").splitlines()
                     if ln.startswith("VLFLEET_MODEL_DIR="))["VLFLEET_MODEL_DIR"]
    target = _sudo(c2, f"ls -S {model_dir}/*.bin | head -n1").strip()
    flip = ("python3 -c \"import sys; p, o = sys.argv[1], 4096; f = open(p, 'r+b'); f.seek(o); b = f.read(1); "
            "f.seek(o); f.write(bytes([b[0] ^ 0xFF])); f.close(); print(b[0])\" " + target)
    try:
        _sudo(c1, "systemctl stop vlfleet")
        _sudo(c2, flip)
        _sudo(vm1, "swapoff -a")
        _sudo(vm1, f"mkdir -p {Path(DROP_IN).parent} && printf '[Service]\\nLimitNOFILE=1024\\n' > {DROP_IN} && "
                   "systemctl daemon-reload && systemctl restart vlfleet")
        _wait_ready(vm1)
        yield {"model_file": target, "model_dir": model_dir}
    finally:
        _sudo(c1, "systemctl start vlfleet")
        _sudo(c2, flip)  # xor again: the original byte
        _sudo(vm1, "swapon -a")
        _sudo(vm1, f"rm -f {DROP_IN} && systemctl daemon-reload && systemctl restart vlfleet")
        _wait_ready(c1)
        _wait_ready(vm1)


def _check_findings(report: ChecklistRun, broken: dict) -> None:
    _expect(report, BROKEN)
    for host, ids in BROKEN.items():
        for cid in ids:
            assert report.get(host, cid).check.remediation == registry.get(cid).remediation
    rel = Path(broken["model_file"]).relative_to(broken["model_dir"]).as_posix()
    assert f"modified: {rel} (sha256 differs from the manifest)" in report.get("c2", "MODEL-ARTIFACT").message
    assert "1024" in report.get("vm1", "SVC-NOFILE").message and DROP_IN in report.get("vm1", "SVC-NOFILE").message
    assert "no swap is active" in report.get("vm1", "SWAP-ACTIVE").message
    assert {r.id for r in report.results if r.host == "c1" and r.status == "blocked"} == {
        "SVC-NOFILE", "CPU-AFFINITY", "NUMA-LOCAL", "PORT-LISTEN", "SVC-READYZ", "SVC-STREAM", "ENGINE-TUNED"}
    gov = report.get("vm1", "CPU-GOVERNOR")
    assert gov.status == "n/a" and "no cpufreq on this host" in gov.message
    assert report.exit_code == 1


class TestBrokenHosts:
    """Each way of running reports the same findings; `broken` is restored when the class ends."""

    def test_via_vlfleet_preflight(self, inventory, waivers_file, broken, tmp_path):
        done, report = _vlfleet_preflight(inventory, waivers_file, tmp_path)
        assert done.returncode == 1
        _check_findings(report, broken)
        assert "preflight: not ready" in done.stderr
        for line in ("c1 SVC-ACTIVE [FAIL]", "c2 MODEL-ARTIFACT [FAIL]", "vm1 SWAP-ACTIVE [FAIL]",
                     "vm1 SVC-NOFILE [FAIL]", "fix: " + registry.get("SVC-NOFILE").remediation):
            assert line in done.stdout


    def test_via_plain_pytest(self, inventory, waivers_file, broken, tmp_path):
        from ops.playbook import ansible_env

        env = {**ansible_env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("VLFLEET_REQUIRE_ALL", None)
        started = time.monotonic()
        done = subprocess.run([str(BIN / "pytest"), "-p", "no:cacheprovider", "ops/preflight/test_checklist.py",
                               "--hosts=ansible://c1,ansible://c2,ansible://vm1", f"--ansible-inventory={inventory}",
                               f"--preflight-waivers={waivers_file}", f"--preflight-json={tmp_path / 'r.json'}",
                               f"--junit-xml={tmp_path / 'pytest.xml'}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              stdin=subprocess.DEVNULL)
        print(f"\n[preflight] plain pytest took {time.monotonic() - started:.1f} s\n" + done.stdout[-6000:])
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr
        _check_findings(ChecklistRun.from_json(json.loads((tmp_path / "r.json").read_text())), broken)
        assert "SVC-ACTIVE [error] on c1: vlfleet.service is inactive" in done.stdout
        assert "4 failed" in done.stdout  # pytest's own count: the four error-severity findings


    def test_via_the_preflight_role(self, inventory, waivers_file, broken, tmp_path):
        from ops.playbook import run_playbook

        run = run_playbook(inventory, "preflight.yml", {"preflight_waivers_file": str(waivers_file),
                                                        "preflight_report_dir": str(tmp_path)},
                           timeout=RUN_TIMEOUT, echo=None)
        print(f"\n[preflight] role took {run.duration:.1f} s\n{run.summary()}")
        assert not run.ok
        message = " ".join(f["msg"] for fails in run.failed.values() for f in fails)
        for host, ids in BROKEN.items():
            for cid in ids:
                assert f"[{host} {cid}]" in message
        assert "fix: " + registry.get("SVC-ACTIVE").remediation in message
        assert run.changed_count("c1") == 0
        _check_findings(ChecklistRun.from_json(json.loads((tmp_path / "preflight.json").read_text())), broken)


def test_fleet_ready_again_after_restore(inventory, waivers_file, tmp_path):
    # After TestBrokenHosts: its class fixture has put every host back; the shared fleet must be ready again.
    done, report = _vlfleet_preflight(inventory, waivers_file, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _expect(report, {})

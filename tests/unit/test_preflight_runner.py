"""The fleet runner and `vlfleet preflight` without a fleet: host patterns, input errors, an unreachable host.

The unreachable host is 127.0.0.1 on a closed port: real ssh, real testinfra, loopback only.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ops.preflight import registry
from ops.preflight.runner import Options, PreflightError, resolve_hosts, run_fleet
from tests.prereq import require_tools

REPO = Path(__file__).resolve().parents[2]
VLFLEET = Path(sys.executable).parent / "vlfleet"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket goes


@pytest.fixture
def dead_inventory(tmp_path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(f"""all:
  children:
    vlm:
      hosts:
        ghost:
          ansible_host: 127.0.0.1
          ansible_port: {_closed_port()}
          ansible_user: deploy
          ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5
""")
    return path


@pytest.fixture
def example_inventory(tmp_path) -> Path:
    # Ansible's YAML inventory plugin goes by the file's extension.
    path = tmp_path / "example.yml"
    path.write_text((REPO / "inventory.example").read_text())
    return path


def test_resolve_hosts_patterns(example_inventory):
    inv = example_inventory
    assert resolve_hosts(inv, "vlm") == ["vlm1", "vlm2"]
    assert resolve_hosts(inv, "vlm2,lb1") == ["vlm2", "lb1"]
    with pytest.raises(PreflightError, match=r"no host of .* matches 'nosuch'"):
        resolve_hosts(inv, "nosuch")
    with pytest.raises(PreflightError, match=r"inventory .* not found"):
        resolve_hosts(REPO / "no-such-inventory.yml")


def test_unreachable_host_fails_reachability_and_blocks_the_rest(dead_inventory, tmp_path):
    require_tools("ssh")
    report = run_fleet(dead_inventory, ["ghost"], Options(), out_dir=tmp_path / "logs")
    assert report.exit_code == 1
    reach = report.get("ghost", "HOST-REACHABLE")
    assert reach.status == "fail" and reach.message.startswith("ssh failed: ") and "refused" in reach.message, \
        reach.message
    others = [r for r in report.results if r.id != "HOST-REACHABLE"]
    assert len(others) == len(registry.CHECKS) - 1
    assert {r.status for r in others} == {"blocked"}
    assert (tmp_path / "logs" / "ghost.log").is_file()


def test_bad_waivers_stop_before_any_host_is_contacted(dead_inventory, tmp_path):
    bad = tmp_path / "w.yml"
    bad.write_text("- {id: CLOCK-SYNC, reason: r}\n")
    with pytest.raises(PreflightError, match="`expires` must be a date"):
        run_fleet(dead_inventory, ["ghost"], Options(waivers=str(bad)), out_dir=tmp_path)
    assert not list(tmp_path.glob("*.log"))


def _vlfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VLFLEET), "preflight", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_task_input_errors_say_what_to_do(tmp_path, example_inventory):
    missing = _vlfleet("--inventory", str(tmp_path / "nope.yml"))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "preflight: inventory" in missing.stderr and "inventory.example" in missing.stderr
    no_waivers = _vlfleet("--inventory", str(example_inventory), "--waivers", str(tmp_path / "w.yml"))
    assert no_waivers.returncode == 1 and "waivers file" in no_waivers.stderr and "not found" in no_waivers.stderr
    bad_ignore = _vlfleet("--inventory", str(example_inventory), "--ignore", "SWAPP")
    assert bad_ignore.returncode == 1 and "unknown check id 'SWAPP'" in bad_ignore.stderr


def test_task_reports_an_unreachable_host(dead_inventory, tmp_path):
    require_tools("ssh")
    done = _vlfleet("--inventory", str(dead_inventory), "--json", str(tmp_path / "r.json"),
                    "--junit", str(tmp_path / "r.xml"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT READY: 1 host(s)" in done.stdout and "ghost HOST-REACHABLE [FAIL]" in done.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["exit_code"] == 1 and data["summary"]["blocked"] == len(registry.CHECKS) - 1
    assert (tmp_path / "r.xml").read_text().count("<testcase") == len(registry.CHECKS)


def test_checklist_as_root_on_a_host_without_sudo(tmp_path):
    # Root needs no sudo: the checklist run on the host itself (local://) must not stop at "sudo: not found".
    # PATH without sudo, so the host lacks it whatever this machine has installed.
    import os
    import shutil

    require_tools("id", "timeout", "sh", root=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "timeout", "sh", "grep", "cat", "nproc", "uname", "test", "systemctl"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir)}
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "ops/preflight/test_checklist.py"),
                           "-p", "no:cacheprovider", "-q", "--hosts=local://", "-k", "reachable or cpu_avx2",
                           f"--preflight-json={out}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    status = {r["id"]: (r["status"], r["message"]) for r in json.loads(out.read_text())["results"]}
    assert status["HOST-REACHABLE"][0] == "pass", (status, done.stdout[-2000:])
    assert status["CPU-AVX2"][0] in ("pass", "fail"), status  # ran, not blocked behind HOST-REACHABLE
    assert "sudo" not in status["CPU-AVX2"][1], status

"""Mistakes an operator can make with staging fleets get a message that says what to do, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ops.staging import fleet, system
from ops.staging.system import StagingError
from tests.prereq import require

VLFLEET = Path(sys.executable).parent / "vlfleet"


def test_missing_tool_names_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StagingError) as e:
        system.require_tools("systemd-nspawn", "qemu-system-x86_64", "debootstrap")
    assert "apt-get install debootstrap qemu-system-x86 systemd-container" in str(e.value)


def test_failed_command_carries_its_stderr():
    with pytest.raises(StagingError, match=r"exit 2.*No such file"):
        system.run(["ls", "/nonexistent-vlfleet-path"])


@pytest.mark.parametrize("kwargs, message", [
    ({"containers": -1}, "--containers must be 0..49"),
    ({"vms": 100}, "--vms must be 0..99"),
    ({"containers": 0, "vms": 0, "lb": False}, "at least one host"),
    ({"name": "Bad Name"}, "lowercase letters"),
    ({"accel": "hvf"}, "accel must be auto, kvm or tcg"),
])
def test_bad_request_is_refused_before_touching_the_system(kwargs, message):
    with pytest.raises(StagingError, match=message):
        fleet.up(**kwargs)


def test_unknown_fleet_down_and_status(monkeypatch, tmp_path):
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path))
    assert fleet.down("nosuch") == []
    assert fleet.status("nosuch") is None
    assert fleet.get("nosuch") is None


def _as_nobody(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLFLEET_CACHE": str(cache), "HOME": str(cache)}
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(VLFLEET), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cache)


def test_up_as_non_root_says_so():
    require(os.geteuid() == 0 and shutil.which("setpriv") is not None, "needs root and setpriv to drop to nobody")
    # pytest's tmp_path sits under a root-only directory; nobody needs one it can reach.
    with tempfile.TemporaryDirectory(prefix="vlfleet-nobody-", dir="/tmp") as d:
        Path(d).chmod(0o777)
        res = _as_nobody(["staging.up", "--name", "t"], Path(d))
    assert res.returncode == 1
    assert "need root" in res.stderr and "Traceback" not in res.stderr


def test_ssh_to_unknown_fleet_says_how_to_start_it(tmp_path):
    env = {**os.environ, "VLFLEET_CACHE": str(tmp_path)}
    res = subprocess.run([str(VLFLEET), "staging.ssh", "c1", "--name", "nosuch"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 1
    assert "vlfleet staging.up --name nosuch" in res.stderr and "Traceback" not in res.stderr

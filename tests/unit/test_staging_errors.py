"""Mistakes an operator can make with staging fleets get a message that says what to do, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.staging import fleet, system
from ops.staging.system import StagingError

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


# The `vlfleet` console script with a non-root effective uid. The root check reads os.geteuid()
# (ops/staging/system.py require_root), so the child fakes that one call instead of becoming user nobody: nobody
# cannot reach a checkout (and its venv) under a 0700 or 0750 directory, such as a home directory or `mktemp -d`.
# Everything else is the real command: its argument parsing, the task, the message and the exit code.
AS_NON_ROOT = "import os, sys; os.geteuid = lambda: 65534; sys.argv[0] = 'vlfleet'; from ops.cli import main; main()"


def test_up_as_non_root_says_so(tmp_path):
    res = subprocess.run([sys.executable, "-c", AS_NON_ROOT, "staging.up", "--name", "t"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "VLFLEET_CACHE": str(tmp_path)}, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.strip() == ("staging.up: staging fleets need root (network namespaces, mounts, nspawn): run as "
                                  "root or with sudo"), res.stderr
    assert not any(tmp_path.iterdir()), "the refused command wrote into the cache"


def test_ssh_to_unknown_fleet_says_how_to_start_it(tmp_path):
    env = {**os.environ, "VLFLEET_CACHE": str(tmp_path)}
    res = subprocess.run([str(VLFLEET), "staging.ssh", "c1", "--name", "nosuch"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 1
    assert "vlfleet staging.up --name nosuch" in res.stderr and "Traceback" not in res.stderr

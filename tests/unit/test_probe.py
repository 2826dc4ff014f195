"""The host program's probes run as the controller runs them on a host: `snapshot` and `facts` by a bare system
python3 given the archive (no service package, no Pillow), against a release tree in a temporary directory and this
machine's own /proc. tests/integration/test_probe.py runs the venv commands against the real service."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.fleet import host_program
from ops.host.probe import image_size
from ops.report import parse_facts
from service.runtime import contract

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def run(python: str, command: str, *args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # -I: no PYTHONPATH, no user site, not the working directory: only what a host's python3 has
    line = [python, "-I", str(host_program.build().path), command, *(str(a) for a in args)]
    return subprocess.run(line, capture_output=True, text=True, timeout=120, cwd=cwd)


def parse(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def release_root(tmp_path) -> Path:
    """<root>/current -> releases/r1 with a venv python, an env file, a model manifest and a CPU plan."""
    root = tmp_path / "opt"
    release = root / "releases" / "r1"
    (release / "venv" / "bin").mkdir(parents=True)
    python = release / "venv" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    model = root / "models" / "a1"
    model.mkdir(parents=True)
    (model / "manifest.json").write_text('{"artifact_id": "a1", "files": {}}\n')
    plan = tmp_path / "cpu-plan.json"
    plan.write_text('{"cpus": [0], "threads": 1}\n')
    (release / "vlfleet.env").write_text(
        f"# rendered\nVLFLEET_MODEL_DIR=/nowhere\nVLFLEET_MODEL_DIR={model}\nVLFLEET_CPU_PLAN_FILE={plan}\n"
        f"VLFLEET_MODEL_CACHE_DIR={tmp_path}/cache-not-made-yet\nVLFLEET_HOST=127.0.0.9\nVLFLEET_PORT=8123\n")
    (root / "current").symlink_to("releases/r1")
    return root


def test_snapshot_reads_the_release_with_the_system_python(release_root, tmp_path):
    done = run(SYSTEM_PYTHON, "snapshot", release_root, "vlfleet-probe-test-none", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    s = parse(done.stdout)
    release = release_root / "releases" / "r1"
    assert s["target"] == str(release.resolve())
    assert s["python"] == f"{release.resolve()}/venv/bin/python"
    assert s["env"] == (release / "vlfleet.env").read_text()
    assert json.loads(s["manifest"])["artifact_id"] == "a1"  # the last VLFLEET_MODEL_DIR wins, as in systemd
    assert json.loads(s["plan"]) == {"cpus": [0], "threads": 1}
    assert s["cache"].strip() == f"{tmp_path}/cache-not-made-yet"
    for key in ("df_models", "df_cache"):  # one row: mount, fstype, bytes free (df of the parent when missing)
        (row,) = s[key].splitlines()
        assert len(row.split()) == 3 and row.split()[2].isdigit(), (key, s[key])
    assert len(s["df_tmp"].splitlines()) == 2
    assert s["flags"].startswith("flags") and "MemTotal:" in s["meminfo"]
    assert s["init_limits"].startswith("Max open files")
    assert s["container"] in ("yes", "no")


def test_snapshot_without_a_release_says_so_in_empty_sections(tmp_path):
    done = run(SYSTEM_PYTHON, "snapshot", tmp_path / "empty", "vlfleet-probe-test-none", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    s = parse(done.stdout)
    assert (s["target"], s["python"], s["env"], s["manifest"], s["listen"]) == ("", "", "", "", "")
    assert s["df_models"] == ""  # df of a missing path: no row (the checklist reports df's failure)
    assert s["cache"].strip() == contract.MODEL_CACHE_DIR


def test_facts_of_this_machine_parse_into_the_report_row(release_root, tmp_path):
    done = run(SYSTEM_PYTHON, "facts", release_root, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    row = parse_facts(parse(done.stdout))
    assert row["cpus"] == os.sysconf("SC_NPROCESSORS_CONF") and row["kernel"] == os.uname().release
    assert row["mem_total_bytes"] > 0 and row["swap_total_bytes"] is not None
    assert (row["pinned_cpus"], row["threads"]) == ([0], 1)
    assert (row["service_host"], row["service_port"]) == ("127.0.0.9", 8123)
    assert row["cpu_model"] and row["os"]


@pytest.mark.parametrize("args", [[], ["nope"], ["readyz"], ["latency", "h", "not-a-port", "1", "1", "1"]])
def test_a_wrong_command_line_is_a_usage_error(args):
    done = run(SYSTEM_PYTHON, *args) if args else run(SYSTEM_PYTHON, "")
    assert done.returncode == 2
    assert parse(done.stdout)["error"].startswith("usage: ")


@pytest.mark.parametrize(("text", "size"), [("", (416, 277)), ("64x64", (64, 64)), ("4096X1", (4096, 1))])
def test_image_size_reads_width_and_height(text, size):
    assert image_size(text) == size


@pytest.mark.parametrize("text", ["64", "0x10", "10x", "x10", "4097x1", "-1x5", "ax b"])
def test_image_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match=r"WIDTHxHEIGHT, each 1\.\.4096"):
        image_size(text)

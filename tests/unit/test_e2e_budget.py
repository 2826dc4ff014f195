"""An exhausted e2e time budget fails the run, naming the slowest tests; it never turns into an xfail or a skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = "from tests.budget import *  # noqa: F403 (the hooks, as tests/conftest.py imports them)\n"
TESTS = """
import time

def test_slow():
    time.sleep(0.5)

def test_after_the_budget():
    pass
"""


def _run(tmp_path: Path, budget: str) -> tuple[subprocess.CompletedProcess, Path]:
    e2e = tmp_path / "tests" / "e2e"
    e2e.mkdir(parents=True)
    (e2e / "conftest.py").write_text(CONFTEST)
    (e2e / "test_mod.py").write_text(TESTS)
    cache = tmp_path / "cache"
    env = {**os.environ, "VLFLEET_E2E_BUDGET_S": budget, "VLFLEET_CACHE": str(cache),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests/e2e"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, cache / "reports" / "test-times.json"


def test_exhausted_budget_fails_and_names_the_slowest(tmp_path):
    done, _ = _run(tmp_path, "0.2")
    assert done.returncode == 1, done.stdout
    assert "1 passed, 1 error" in done.stdout, done.stdout  # failed in its setup: an error, never a pass
    assert "xfail" not in done.stdout.lower() and "skipped" not in done.stdout
    assert "the e2e time budget of 0 s (VLFLEET_E2E_BUDGET_S) was spent" in done.stdout
    assert "slowest: tests/e2e/test_mod.py::test_slow" in done.stdout


def test_within_budget_every_test_runs_and_times_are_written(tmp_path):
    done, times = _run(tmp_path, "600")
    assert done.returncode == 0, done.stdout
    assert "2 passed" in done.stdout
    data = json.loads(times.read_text())
    assert set(data["tests"]) == {"tests/e2e/test_mod.py::test_slow", "tests/e2e/test_mod.py::test_after_the_budget"}
    assert data["tests"]["tests/e2e/test_mod.py::test_slow"] >= 0.5
    assert data["modules"]["tests/e2e/test_mod.py"] >= 0.5
    assert data["tests_run"] == 2 and data["exit_status"] == 0 and data["session_s"] >= data["e2e_s"] >= 0.5

"""The e2e time budget: a test that has not started when the budget is spent fails, naming the slowest tests.

CI has 90 minutes in all. A run that would overrun fails early with a message that says where the time went,
rather than being killed without one; a test that did not run is never reported as passed, skipped or xfailed.
Also writes the times of the run, per test, per module and in all (`test-times.json` under the cache's reports/;
results/ci-timing.json is a copy of one CI-like run, rendered into results/ci-timing.md by `python -m ops.docs`).

Used as hooks by tests/conftest.py (imported there); ``VLFLEET_E2E_BUDGET_S`` sets the budget.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

SCOPE = "tests/e2e/"
_times: dict[str, float] = defaultdict(float)
_started: list[float] = []  # when the first e2e test started
_session: list[float] = []  # when the session started


def budget_s() -> float:
    # 70 minutes: what a cold run's e2e part may take and still leave CI's 90 the integration and unit suites (about
    # 10 minutes on 2 cores), the demo after them and the apt/venv steps before (results/ci-timing.md: 57 of 70).
    return float(os.environ.get("VLFLEET_E2E_BUDGET_S", "4200"))


def slowest(n: int = 5) -> str:
    top = sorted(((k, v) for k, v in _times.items() if SCOPE in k), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{nodeid} {seconds:.0f} s" for nodeid, seconds in top) or "none finished"


def pytest_runtest_setup(item):
    if SCOPE not in item.nodeid:
        return
    if not _started:
        _started.append(time.monotonic())
    spent = time.monotonic() - _started[0]
    if spent > budget_s():
        pytest.fail(f"not run: the e2e time budget of {budget_s():.0f} s (VLFLEET_E2E_BUDGET_S) was spent after "
                    f"{spent:.0f} s; slowest: {slowest()}", pytrace=False)


def pytest_sessionstart(session):
    _session.append(time.monotonic())


def pytest_runtest_logreport(report):
    _times[report.nodeid] += report.duration


def pytest_sessionfinish(session, exitstatus):
    if not _times:
        return
    from ops.machine import describe
    from ops.paths import cache_root

    modules: dict[str, float] = defaultdict(float)
    for nodeid, seconds in _times.items():
        modules[nodeid.split("::")[0]] += seconds
    out = cache_root() / "reports"
    out.mkdir(parents=True, exist_ok=True)
    data = {"machine": describe(), "exit_status": int(exitstatus), "tests_run": len(_times),
            "session_s": round(time.monotonic() - _session[0], 1) if _session else None,
            "e2e_s": round(time.monotonic() - _started[0], 1) if _started else None,
            "modules": {m: round(s, 1) for m, s in sorted(modules.items())},
            "tests": {n: round(s, 1) for n, s in sorted(_times.items())}}
    (out / "test-times.json").write_text(json.dumps(data, indent=1))

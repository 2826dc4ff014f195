"""Measurements the tests keep: one small JSON file each under the cache's reports/ (`$VLFLEET_CACHE/reports/`).

`python -m ops.docs --collect REPORTS_DIR` copies them into results/e2e/, from which the figures of
docs/reliability.md are generated (ops/docs/e2e_reports.py lists which test writes which file).

Only a test that passed keeps its reports: ``record`` prints the report at once (what a failing run's log keeps)
and holds it until the test has ended; tests/conftest.py then calls ``finish``, which writes it if the test passed
in every phase and drops it otherwise. So a figure in the docs is never one a failing test measured, wherever in
the test the ``record`` call sits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_held: dict[str, list[tuple[str, dict]]] = {}  # test node id -> the reports it recorded, until it has ended


def _running_test() -> str | None:
    """The node id of the test pytest is running (PYTEST_CURRENT_TEST is "NODEID (PHASE)"), or None outside one."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    return current.rsplit(" ", 1)[0] if current else None


def reports_dir() -> Path:
    from ops.paths import cache_root

    return cache_root() / "reports"


def record(name: str, data: dict) -> None:
    """Keep ``data`` as ``<name>.json``, written once the running test has passed (at once outside a test)."""
    print(f"\n[{name}] {json.dumps(data)}")
    test = _running_test()
    if test is None:
        _write(name, data)
    else:
        _held.setdefault(test, []).append((name, data))


def finish(nodeid: str, passed: bool) -> list[Path]:
    """Write the reports test ``nodeid`` recorded if it passed; drop them if it did not. Returns the files written."""
    held = _held.pop(nodeid, [])
    if not passed:
        if held:
            print(f"\n[reports] not written, {nodeid} did not pass: {', '.join(name for name, _ in held)}")
        return []
    return [_write(name, data) for name, data in held]


def _write(name: str, data: dict) -> Path:
    out = reports_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path

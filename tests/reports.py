"""Measurements the tests keep: one small JSON file each under the cache's reports/ (`$VLFLEET_CACHE/reports/`).

`python -m ops.docs --collect REPORTS_DIR` copies them into results/e2e/, from which the figures of
docs/reliability.md are generated (ops/docs/e2e_reports.py lists which test writes which file).
"""

from __future__ import annotations

import json
from pathlib import Path


def record(name: str, data: dict) -> Path:
    """Write ``<name>.json`` and print it (the printed line is what a failing run's log keeps)."""
    from ops.paths import cache_root

    out = cache_root() / "reports"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    print(f"\n[{name}] {json.dumps(data)}")
    return path

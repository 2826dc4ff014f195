"""The Python code stays ruff clean (target py310, the rules in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean():
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "ops", "service", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

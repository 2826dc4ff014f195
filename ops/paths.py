"""Where generated things live: outside git, under one cache root (VLFLEET_CACHE, default ~/.cache/vlfleet)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = Path(os.environ.get("VLFLEET_CACHE", Path.home() / ".cache" / "vlfleet")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def repo_root() -> Path:
    """The checkout this package runs from (templates/, roles/ live beside ops/)."""
    return Path(__file__).resolve().parent.parent

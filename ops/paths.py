"""Where generated things live: outside git, under one cache root (VLFLEET_CACHE, default ~/.cache/vlfleet)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    root = Path(os.environ.get("VLFLEET_CACHE", Path.home() / ".cache" / "vlfleet")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def repo_root() -> Path:
    """The checkout this package runs from (templates/, roles/ live beside ops/)."""
    return Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside ``path`` while building it: parallel sessions (tests, operators) share the
    cache, so one builds and the others wait, then reuse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield

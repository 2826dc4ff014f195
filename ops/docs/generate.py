"""Which file each generator writes, and which of them are stale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ops.bench import runs_index, tuning_page
from ops.docs import api, ci_timing, configuration, reliability
from ops.paths import repo_root


def targets(root: Path | None = None) -> dict[Path, Callable[[], str]]:
    """Each generated file -> the function that renders it."""
    root = root or repo_root()
    out = {root / "docs" / "configuration.md": lambda: configuration.render(root), root / "docs" / "api.md": api.render}
    if (root / "results" / "ci-timing.json").is_file():
        out[root / "results" / "ci-timing.md"] = lambda: ci_timing.render(root)
    if (root / reliability.DOC).is_file():  # generated in place: only its spans, so it must exist
        out[root / reliability.DOC] = lambda: reliability.render(root)
    if (root / "results").is_dir():
        out[root / "docs" / "tuning.md"] = lambda: tuning_page.render(root / "results")
    if (root / runs_index.README).is_file():  # generated in place: only its runs table
        out[root / runs_index.README] = lambda: runs_index.render(root)
    return out


def stale(root: Path | None = None) -> list[Path]:
    return [path for path, render in targets(root).items()
            if not path.is_file() or path.read_text() != render()]

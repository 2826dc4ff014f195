"""docs/engines.md is written by hand from bench runs: every figure in one of its paragraphs or bullets (seconds, ms,
GB, ratios, percentages) must be printed in a run's bench.md (or the generated tuning page) that the paragraph
links, so a figure typed in or left over from an older run fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "engines.md"
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+) ?(?:x\b|s\b|ms\b|GB\b|%)")
LINK = re.compile(r"\]\(((?:\.\./results/|tuning\.md)[^)#]*)\)")


def paragraphs() -> list[str]:
    """The page's paragraphs and bullets that state a figure."""
    return [p for p in re.split(r"\n(?:- |\n)", DOC.read_text()) if FIGURE.search(p)]


def figures_missing(paragraph: str, base: Path) -> list[str]:
    sources = [(base / link).resolve() for link in LINK.findall(paragraph)]
    printed = " ".join(path.read_text() for path in sources if path.is_file())
    return [f for f in FIGURE.findall(paragraph) if not re.search(rf"(?<![\d.]){re.escape(f)}(?!\d)", printed)]


@pytest.mark.parametrize("paragraph", paragraphs(), ids=lambda p: p.strip()[:40])
def test_every_figure_is_printed_in_a_run_the_paragraph_links(paragraph):
    missing = figures_missing(paragraph, DOC.parent)
    assert not missing, f"figures not in any bench.md this paragraph of docs/engines.md links: {missing}"


def test_a_figure_no_linked_run_printed_is_found(tmp_path):
    run = tmp_path / "results" / "run"
    run.mkdir(parents=True)
    (run / "bench.md").write_text("first token 1.84 s, 41.4 ms/token, 2.34x")
    (tmp_path / "docs").mkdir()
    text = "hybrid ([run](../results/run/bench.md)): 1.84 s, 41.4 ms/token, 2.34x one client's; 6.58 GB, 1.8 s"
    assert figures_missing(text, tmp_path / "docs") == ["6.58", "1.8"]
    assert figures_missing("no link: 1.84 s", tmp_path / "docs") == ["1.84"]

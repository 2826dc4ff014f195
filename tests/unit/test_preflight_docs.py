"""docs/checklist.md is generated from the registry; this fails when the two drift apart."""

from __future__ import annotations

from pathlib import Path

from ops.preflight import docs, registry

PAGE = Path(__file__).resolve().parents[2] / "docs" / "checklist.md"


def test_committed_page_matches_the_registry():
    assert PAGE.read_text() == docs.render(), (
        "docs/checklist.md is out of date: run `python -m ops.preflight.docs > docs/checklist.md` and commit it")


def test_every_check_has_a_section_with_its_fix():
    text = docs.render()
    for c in registry.CHECKS:
        section = text.split(f"\n### {c.id}\n", 1)[1].split("\n### ", 1)[0]
        assert f"**Fix:** {c.remediation}" in section
        assert f"**Severity:** {c.severity}." in section

"""docs/checklist.md is generated from the registry; this fails when the two drift apart."""

from __future__ import annotations

import json
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


def test_the_run_paragraph_reads_its_figures_from_the_run(tmp_path):
    run = json.loads((PAGE.parents[1] / docs.RUN).read_text())
    run.update(duration_s=12.4, exit_code=0, hosts=["h1"], checks=run["checks"][:2],
               results=[{**r, "host": "h1", "status": "pass"} for r in run["results"][:2]])
    (tmp_path / "results").mkdir()
    (tmp_path / docs.RUN).write_text(json.dumps(run))
    text = " ".join(docs.run_summary(tmp_path).split())
    assert "(h1: " in text and "12 s for the 1 host in parallel" in text and "It says READY." in text
    newer = [c.id for c in registry.CHECKS[2:]]
    assert f"The run predates {', '.join(newer)}: they are not in it." in text
    assert " ".join(docs.run_summary().split()) in " ".join(PAGE.read_text().split())

"""results/e2e/ (the reliability reports the tests write, collected into the repository) and the figures of
docs/reliability.md generated from them: a figure cannot drift from its report, and each names its test."""

from __future__ import annotations

import ast
import json
import re
import shutil

import pytest

from ops.docs import e2e_reports, reliability
from ops.paths import repo_root

ROOT = repo_root()


def _copy_repo_doc(tmp_path):
    """docs/reliability.md and results/e2e/ of the repository under tmp_path, to change them there."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / reliability.DOC, tmp_path / reliability.DOC)
    shutil.copytree(e2e_reports.results_dir(ROOT), e2e_reports.results_dir(tmp_path))
    return tmp_path / reliability.DOC


def test_collect_copies_what_it_finds_and_names_what_is_missing(tmp_path):
    src, root = tmp_path / "reports", tmp_path / "repo"
    src.mkdir()
    (src / "faults-kill9.json").write_text(json.dumps({"host": "c1", "ready_after_s": 5.9}))
    (src / "rollout-e2e.json").write_text('{"truncated')  # a write cut short must not replace a good copy
    (src / "test-times.json").write_text("{}")  # not a reliability report: left alone
    old = e2e_reports.results_dir(root)
    old.mkdir(parents=True)
    (old / "rollout-e2e.json").write_text("{}")
    (old / e2e_reports.INDEX).write_text(json.dumps({"rollout-e2e": "2026-01-01 00:00 UTC"}))

    result = e2e_reports.collect(src, root)

    assert result.copied == ["faults-kill9"]
    assert set(result.unreadable) == {"rollout-e2e"}
    assert set(result.missing) == set(e2e_reports.REPORTS) - {"faults-kill9", "rollout-e2e"}
    assert json.loads((old / "faults-kill9.json").read_text())["ready_after_s"] == 5.9
    assert (old / "rollout-e2e.json").read_text() == "{}" and not (old / "test-times.json").exists()
    index = e2e_reports.written(root)
    assert index["rollout-e2e"] == "2026-01-01 00:00 UTC" and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC$",
                                                                       index["faults-kill9"])
    lines = e2e_reports.summary(result, src, root)
    assert lines[0].startswith(f"copied 1 of {len(e2e_reports.REPORTS)} reports from {src}")
    kept = next(line for line in lines if "rollout-e2e.json" in line)
    assert kept.startswith("MISSING") and "unreadable" in kept and "2026-01-01 00:00 UTC is kept" in kept
    absent = next(line for line in lines if "hostile-images-rss.json" in line)
    assert "not found" in absent and e2e_reports.REPORTS["hostile-images-rss"] in absent and "has none" in absent


def test_a_changed_report_makes_the_doc_stale(tmp_path):
    doc = _copy_repo_doc(tmp_path)
    assert reliability.render(tmp_path) == doc.read_text()
    report = e2e_reports.results_dir(tmp_path) / "faults-kill9.json"
    data = json.loads(report.read_text())
    data["ready_after_s"] += 100
    report.write_text(json.dumps(data))
    fresh = reliability.render(tmp_path)
    assert fresh != doc.read_text() and f"**{data['ready_after_s']:.1f} s**" in fresh


def test_a_missing_report_gives_no_figure(tmp_path):
    _copy_repo_doc(tmp_path)
    (e2e_reports.results_dir(tmp_path) / "queue-overflow-rss.json").unlink(missing_ok=True)
    text = reliability.render(tmp_path)
    assert "<!-- gen:queue-overflow-rss -->not measured: no results/e2e/queue-overflow-rss.json collected yet" in text


@pytest.mark.parametrize("edit, error", [
    (lambda t: t.replace("<!-- gen:faults-kill9 -->", "<!-- gen:faults-kill-9 -->"), "unknown generated span"),
    (lambda t: re.sub(r"<!-- gen:rollback-e2e -->.*?<!-- /gen -->", "32 s", t), "missing: rollback-e2e"),
])
def test_unknown_or_lost_spans_are_errors(tmp_path, edit, error):
    doc = _copy_repo_doc(tmp_path)
    doc.write_text(edit(doc.read_text()))
    with pytest.raises(ValueError, match=error):
        reliability.render(tmp_path)


def test_every_span_has_a_report_and_every_report_a_span():
    assert {name.split(":")[0] for name in reliability.SPANS} == set(e2e_reports.REPORTS)


@pytest.mark.parametrize("name", list(e2e_reports.REPORTS))
def test_the_named_test_writes_its_report(name):
    # The test function must name the report (faults-* through test_faults.py's _record, which adds the prefix).
    path, _, function = e2e_reports.REPORTS[name].partition("::")
    tree = ast.parse((ROOT / path).read_text())
    body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
    strings = {node.value for node in ast.walk(body) if isinstance(node, ast.Constant)}
    assert {name, name.removeprefix("faults-")} & strings, f"{function} does not write {name}.json"


def test_each_generated_row_names_the_test_that_measured_it():
    for line in (ROOT / reliability.DOC).read_text().splitlines():
        for name in re.findall(r"<!-- gen:([a-z0-9:-]+) -->.*?<!-- /gen -->", line):
            function = e2e_reports.REPORTS[name.split(":")[0]].rsplit("::", 1)[1]
            assert function in line, f"the row of {name} does not name {function}"

"""The check registry is consistent, and every id has exactly one testinfra test (and vice versa)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ops.preflight import registry

CHECKLIST = Path(__file__).resolve().parents[2] / "ops" / "preflight" / "test_checklist.py"


def _ids_in_checklist() -> list[str]:
    # Read the decorators from the source: importing the module would need testinfra's host fixture.
    tree = ast.parse(CHECKLIST.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            ids = [d.args[0].value for d in node.decorator_list
                   if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "check"]
            assert len(ids) == 1, f"{node.name} needs exactly one @check(ID), has {ids}"
            out += ids
    return out


def test_registry_has_no_problems():
    assert registry.problems() == []


def test_every_check_has_one_test_in_registry_order():
    assert _ids_in_checklist() == registry.ids()


def test_issue_checks_are_all_there():
    required = {"CPU-AVX2", "CPU-AVX512", "RUNTIME-VERSIONS", "MODEL-ARTIFACT", "CPU-GOVERNOR", "TMP-LOCAL",
                "SVC-NOFILE", "SWAP-ACTIVE", "MEM-HEADROOM", "DISK-FREE", "SVC-ENABLED", "SVC-ACTIVE", "SVC-RESTART",
                "PORT-LISTEN", "SVC-READYZ", "SVC-STREAM", "CPU-AFFINITY", "CLOCK-SYNC", "PYTHON-VERSION"}
    assert required <= set(registry.ids())
    assert registry.get("CPU-AVX2").severity == registry.ERROR


def test_problems_catches_a_bad_table(monkeypatch):
    bad = (registry.Check("lower-case", "fatal", "x", "", ""),
           registry.Check("A-B", registry.ERROR, "x", "d", "r", depends_on=("C-D",)),
           registry.Check("C-D", registry.ERROR, "x", "d", "r"),
           registry.Check("C-D", registry.ERROR, "x", "d", "r"))
    monkeypatch.setattr(registry, "CHECKS", bad)
    found = "\n".join(registry.problems())
    for expected in ("lower-case: id must look like", "severity 'fatal'", "needs a description",
                     "A-B: depends on C-D, which is not an earlier check", "C-D: duplicate id"):
        assert expected in found


def test_unknown_id_names_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown check id 'NOPE'.*CPU-AVX2"):
        registry.get("NOPE")


@pytest.mark.parametrize("check", registry.CHECKS, ids=lambda c: c.id)
def test_remediation_says_what_to_run_or_change(check):
    # Every fix names a command or a setting in backticks, not just "fix it".
    assert "`" in check.remediation, check.id

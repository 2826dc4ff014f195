"""docs/architecture.md's folder table is the tree's: every folder it names exists, and every package of ops/ and
service/, every role and every test suite is named in it (a new folder without a line there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def named_folders() -> set[str]:
    """The first column of the folder table: `path/` entries."""
    section = DOC.read_text().split("## Folders and their jobs", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)/` \|", section, flags=re.M)}


def test_every_folder_the_table_names_exists():
    missing = sorted(f for f in named_folders() if not (ROOT / f).is_dir())
    assert not missing, f"docs/architecture.md names folders that are gone: {missing}"


def test_every_package_of_the_tree_is_in_the_table():
    packages = {str(p.parent.relative_to(ROOT)) for top in ("ops", "service")
                for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    packages |= {"roles", "templates", "tests", ".ci", "ops/playbooks", "ops/ansible_plugins"}
    unnamed = sorted(packages - named_folders())
    assert not unnamed, f"packages without a line in docs/architecture.md's folder table: {unnamed}"


def test_every_host_program_module_is_in_its_table():
    modules = {p.stem for p in (ROOT / "ops" / "host").glob("*.py") if not p.stem.startswith("__")}
    text = DOC.read_text().split("## The host program", 1)[1]
    unnamed = sorted(m for m in modules if f"`{m}`" not in text)
    assert not unnamed, f"host program modules missing from docs/architecture.md: {unnamed}"

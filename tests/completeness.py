"""Under VLFLEET_REQUIRE_ALL=1 the run is the whole suite: no option narrows it, and every test function in the tree
is collected.

A run that selects fewer tests than the tree holds says less than a green line suggests, so CI refuses one:

- options that narrow a run (``-k``, ``-m``, ``--deselect``, ``--ignore``, ``--ignore-glob``, ``--lf``, ``--sw``, or
  paths and node ids other than the ``testpaths`` of pyproject.toml) are a usage error;
- after collection, every test function defined in the ``testpaths`` (``def test*`` at module level or in a
  ``Test*`` class, in files matching ``python_files``; a parametrized one counts once, however many cases it has)
  must have at least one collected test. The floor is the tree's own count, not a typed number, so it moves with the
  suite; a function it cannot find among the collected tests (a module that fails to import as a test module, a
  shadowed duplicate name, a class pytest will not collect, a conftest that deselects) fails the session, named.

Used as hooks by tests/conftest.py (imported there).
"""

from __future__ import annotations

import ast
import fnmatch
from collections import Counter
from pathlib import Path

import pytest

from tests.prereq import REQUIRE_ALL

# option dest -> the flag a user typed (a value other than the default narrows the run)
NARROWING = {"keyword": "-k", "markexpr": "-m", "deselect": "--deselect", "ignore": "--ignore",
             "ignore_glob": "--ignore-glob", "lf": "--lf", "stepwise": "--sw"}


def narrowing(config: pytest.Config) -> list[str]:
    """What narrows this run: the flags given and paths or node ids other than the whole ``testpaths``."""
    found = [f"{flag} {value!r}" if not isinstance(value, bool) else flag
             for dest, flag in NARROWING.items() if (value := getattr(config.option, dest, None))]
    if config.args_source is pytest.Config.ArgsSource.ARGS:
        whole = {(config.rootpath / p).resolve() for p in config.getini("testpaths")}
        given = {(config.invocation_params.dir / arg).resolve() if "::" not in arg else arg for arg in config.args}
        if given != whole:
            suite = " ".join(config.getini("testpaths"))
            found.append(f"the arguments {' '.join(config.args)} (the suite is: {suite})")
    return found


def defined_tests(root: Path, testpaths: list[str], python_files: list[str], function_prefixes: list[str],
                  class_prefixes: list[str]) -> list[str]:
    """Every test function defined under ``root``'s ``testpaths``, as ``path::[Class::]name``, duplicates kept.

    Read from the source (ast), not imported: a module whose import fails still counts what it defines.
    Fixtures named like tests (``@pytest.fixture def test_build``) are not tests.
    """
    def is_test(node: ast.AST) -> bool:
        return (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name.startswith(tuple(function_prefixes))
                and not any("fixture" in ast.unparse(d) for d in node.decorator_list))

    found: list[str] = []
    files = sorted({f for p in testpaths for f in (root / p).rglob("*.py")
                    if any(fnmatch.fnmatch(f.name, pattern) for pattern in python_files)})
    for path in files:
        rel = path.relative_to(root).as_posix()
        for node in ast.parse(path.read_text(), str(path)).body:
            if is_test(node):
                found.append(f"{rel}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith(tuple(class_prefixes)):
                found += [f"{rel}::{node.name}::{item.name}" for item in node.body if is_test(item)]
    return found


def collected_tests(root: Path, items: list[pytest.Item]) -> set[str]:
    """The test functions the session collected, as ``path::[Class::]name`` (one per function, not per case)."""
    out = set()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        cls = f"{item.cls.__name__}::" if item.cls is not None else ""
        try:
            rel = item.path.relative_to(root).as_posix()
        except ValueError:
            rel = item.path.as_posix()
        out.add(f"{rel}::{cls}{item.originalname}")
    return out


def not_collected(defined: list[str], collected: set[str]) -> list[str]:
    """Defined test functions with no collected test, and names defined twice in a module (the first never runs)."""
    counts = Counter(defined)
    missing = [name for name in counts if name not in collected]
    twice = [f"{name} (defined {n} times: only the last runs)" for name, n in counts.items() if n > 1]
    return missing + twice


def pytest_configure(config: pytest.Config) -> None:
    if not REQUIRE_ALL:
        return
    found = narrowing(config)
    if found:
        raise pytest.UsageError(f"VLFLEET_REQUIRE_ALL=1 runs the whole suite, so nothing may narrow it: "
                                f"{'; '.join(found)}. Run without VLFLEET_REQUIRE_ALL to run a part of it.")


def pytest_collection_finish(session: pytest.Session) -> None:
    if not REQUIRE_ALL:
        return
    config = session.config
    defined = defined_tests(config.rootpath, config.getini("testpaths"), config.getini("python_files"),
                            config.getini("python_functions"), config.getini("python_classes"))
    collected = collected_tests(config.rootpath, session.items)
    missing = not_collected(defined, collected)
    if missing:
        shown = "\n  ".join(missing[:20]) + (f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else "")
        pytest.exit(f"VLFLEET_REQUIRE_ALL=1: {len(set(defined) & collected)} of {len(defined)} test functions "
                    f"defined in {', '.join(config.getini('testpaths'))} were collected; not collected:\n  {shown}",
                    returncode=pytest.ExitCode.USAGE_ERROR)

"""CI's switch, VLFLEET_REQUIRE_ALL=1 (tests/conftest.py, tests/completeness.py): a skip or an xfail fails the run, an
option or argument that narrows the run is refused, and a test function of the tree that is not collected fails the
session; and a test's reports are written only when it passed (tests/reports.py).

Each case runs pytest in a subprocess on a small suite of its own, with the project's hooks in its conftest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.completeness import defined_tests, not_collected

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """\
from tests.conftest import (  # noqa: F401 (the hooks under test, as the project's conftest has them)
    pytest_collection_finish,
    pytest_configure,
    pytest_runtest_makereport,
)
"""
SUITE = {
    "test_one.py": """\
import pytest

def test_passes():
    pass

@pytest.mark.parametrize("n", [1, 2, 3])
def test_cases(n):
    assert n
""",
    "deeper/test_two.py": """\
class TestGroup:
    def test_in_a_class(self):
        pass

def test_also_passes():
    pass
""",
}


def run(tmp_path: Path, suite: dict[str, str], *args: str, require_all: bool = True,
        conftest: str = "") -> subprocess.CompletedProcess:
    """pytest on ``suite`` (files under tmp_path/suite, the run's testpaths) with the project's hooks."""
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = suite\n")
    (tmp_path / "conftest.py").write_text(CONFTEST + conftest)
    for name, text in suite.items():
        path = tmp_path / "suite" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLFLEET_", "PYTEST_"))}
    env |= {"PYTHONPATH": str(REPO), "VLFLEET_CACHE": str(tmp_path / "cache"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if require_all:
        env["VLFLEET_REQUIRE_ALL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


# -- skips and xfails -----------------------------------------------------------------------------------------

SKIPPING = {**SUITE, "test_skips.py": """\
import pytest

def test_skipped():
    pytest.skip("needs a thing this machine lacks")

@pytest.mark.xfail(reason="known to fail")
def test_xfailed():
    assert False
"""}


def test_a_skip_and_an_xfail_fail_the_run_under_the_switch(tmp_path):
    done = run(tmp_path, SKIPPING)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 failed, 6 passed" in done.stdout, done.stdout
    assert "skipped or xfailed under VLFLEET_REQUIRE_ALL=1 (CI must run everything): Skipped: needs a thing this " \
           "machine lacks" in done.stdout
    assert "skipped or xfailed under VLFLEET_REQUIRE_ALL=1 (CI must run everything): known to fail" in done.stdout


def test_without_the_switch_a_skip_is_a_skip(tmp_path):
    done = run(tmp_path, SKIPPING, require_all=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed, 1 skipped, 1 xfailed" in done.stdout, done.stdout


# -- narrowing the run ----------------------------------------------------------------------------------------


def test_the_whole_suite_runs_under_the_switch(tmp_path):
    done = run(tmp_path, SUITE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout
    assert run(tmp_path, SUITE, "suite").returncode == 0  # the testpaths named: still the whole suite


def test_options_and_arguments_that_narrow_the_run_are_refused(tmp_path):
    cases = {("-k", "cases"): "-k 'cases'", ("-m", "slow"): "-m 'slow'",
             ("--deselect", "suite/test_one.py::test_passes"): "--deselect",
             ("--ignore", "suite/deeper"): "--ignore", ("suite/deeper",): "the arguments suite/deeper",
             ("suite/test_one.py::test_passes",): "the arguments suite/test_one.py::test_passes"}
    for args, named in cases.items():
        done = run(tmp_path, SUITE, *args)
        assert done.returncode == 4, (args, done.stdout + done.stderr)  # a usage error, no test run
        assert "VLFLEET_REQUIRE_ALL=1 runs the whole suite, so nothing may narrow it" in done.stderr, done.stderr
        assert named in done.stderr, (named, done.stderr)
        assert "passed" not in done.stdout
    # Without the switch the same run is a developer's choice.
    done = run(tmp_path, SUITE, "-k", "cases", require_all=False)
    assert done.returncode == 0 and "3 passed, 3 deselected" in done.stdout, done.stdout


# -- the floor: every test function of the tree is collected --------------------------------------------------

DESELECTS = """
def pytest_collection_modifyitems(items):  # a conftest that drops a test without a word
    items[:] = [item for item in items if item.name != "test_also_passes"]
"""


def test_a_test_function_that_is_not_collected_fails_the_session(tmp_path):
    done = run(tmp_path, SUITE, conftest=DESELECTS)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "VLFLEET_REQUIRE_ALL=1: 3 of 4 test functions defined in suite were collected; not collected:" \
           in done.stdout + done.stderr, done.stdout + done.stderr
    assert "suite/deeper/test_two.py::test_also_passes" in done.stdout + done.stderr
    assert " passed" not in done.stdout  # nothing ran
    # Without the switch the dropped test goes unnoticed: what the floor is for.
    done = run(tmp_path, SUITE, conftest=DESELECTS, require_all=False)
    assert done.returncode == 0 and "5 passed" in done.stdout, done.stdout


def test_a_module_that_does_not_import_counts_what_it_defines(tmp_path):
    broken = {**SUITE, "test_broken.py": "import no_such_module\n\ndef test_never_collected():\n    pass\n"}
    done = run(tmp_path, broken, "--continue-on-collection-errors")
    assert done.returncode != 0
    assert "suite/test_broken.py::test_never_collected" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_tree_count_reads_the_source(tmp_path):
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "test_a.py").write_text("""\
import pytest

@pytest.fixture(scope="module")
def test_build():  # a fixture named like a test is no test
    return 1

@pytest.mark.parametrize("x", range(50))
def test_many(x):
    pass

async def test_async():
    pass

def helper():
    pass

def test_twice():
    pass

def test_twice():  # noqa: F811 (shadows the first, which never runs)
    pass

class TestThing:
    def test_method(self):
        pass

    def helper(self):
        pass

class Other:
    def test_not_collected_by_pytest(self):
        pass
""")
    (tmp_path / "t" / "sub" / "test_b.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "t" / "sub" / "helpers.py").write_text("def test_not_a_test_file():\n    pass\n")
    defined = defined_tests(tmp_path, ["t"], ["test_*.py"], ["test"], ["Test"])
    assert defined == ["t/sub/test_b.py::test_b", "t/test_a.py::test_many", "t/test_a.py::test_async",
                       "t/test_a.py::test_twice", "t/test_a.py::test_twice", "t/test_a.py::TestThing::test_method"]
    # What pytest would collect of it: every function once (the parametrized one 50 times, counted once).
    collected = {"t/sub/test_b.py::test_b", "t/test_a.py::test_many", "t/test_a.py::test_async",
                 "t/test_a.py::test_twice", "t/test_a.py::TestThing::test_method"}
    assert not_collected(defined, collected) == ["t/test_a.py::test_twice (defined 2 times: only the last runs)"]
    assert not_collected(defined, collected - {"t/test_a.py::test_async"}) == [
        "t/test_a.py::test_async", "t/test_a.py::test_twice (defined 2 times: only the last runs)"]


# -- reports are kept only for tests that passed --------------------------------------------------------------

RECORDING = {"test_records.py": """\
from tests.reports import record

def test_measures_and_passes():
    record("kept", {"seconds": 1.5})
    assert True

def test_measures_then_fails():
    record("dropped", {"seconds": 99.0})
    assert False, "the measured thing did not hold"
"""}


def test_a_report_is_written_only_when_its_test_passed(tmp_path):
    done = run(tmp_path, RECORDING, require_all=False)
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout
    reports = tmp_path / "cache" / "reports"
    assert json.loads((reports / "kept.json").read_text()) == {"seconds": 1.5}
    assert not (reports / "dropped.json").exists()
    assert '[dropped] {"seconds": 99.0}' in done.stdout  # still in the failing run's log
    assert "not written, suite/test_records.py::test_measures_then_fails did not pass: dropped" in done.stdout


# -- .ci/run: the suite in a clean environment ----------------------------------------------------------------


def ci_run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict[str, str] | None]:
    """`bash .ci/run` with apt-get and make replaced by stubs (make writes the environment it was given)."""
    stubs, seen = tmp_path / "bin", tmp_path / "make-env"
    stubs.mkdir(exist_ok=True)
    (stubs / "apt-get").write_text("#!/bin/sh\nexit 0\n")
    (stubs / "make").write_text(f"#!/bin/sh\nenv -0 > {seen}\necho \"make $*\"\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLFLEET_", "PYTEST_"))}
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], env={**base, "PATH": f"{stubs}:{os.environ['PATH']}",
                          "VLFLEET_CACHE": str(tmp_path / "cache"), **env}, capture_output=True, text=True, timeout=60)
    made = dict(entry.split("=", 1) for entry in seen.read_text().split("\0") if entry) if seen.exists() else None
    return done, made


def test_ci_run_clears_what_a_developer_exported_and_keeps_the_cache(tmp_path):
    exported = {"VLFLEET_E2E_CONVERGED": "/elsewhere/inventory.yml", "VLFLEET_FAULTS_INVENTORY": "/x.yml",
                "VLFLEET_ROLLOUT_INVENTORY": "/y.yml", "VLFLEET_ENGINE": "serial", "VLFLEET_REQUIRE_ALL": "0",
                "VLFLEET_E2E_BUDGET_S": "5", "PYTEST_ARGS": "-k nothing", "PYTEST_ADDOPTS": "",
                "MAKEFLAGS": "PYTEST_ARGS=tests/unit", "PYTEST_PLUGINS": "some_plugin"}
    done, made = ci_run(tmp_path, **exported)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make test" in done.stdout
    assert made is not None
    assert made["VLFLEET_CACHE"] == str(tmp_path / "cache")  # where the caches live: kept
    assert made["VLFLEET_REQUIRE_ALL"] == "1"  # .ci/run's own
    assert {k for k in made if k.startswith("VLFLEET_")} == {"VLFLEET_CACHE", "VLFLEET_REQUIRE_ALL"}, made
    assert not {"PYTEST_ARGS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "MAKEFLAGS"} & set(made), made
    cleared = next(line for line in done.stderr.splitlines() if line.startswith(".ci/run: unset "))
    assert all(name in cleared for name in exported if name != "VLFLEET_CACHE"), cleared
    assert json.loads((tmp_path / "cache" / "reports" / "ci-run.json").read_text())["exit"] == 0


def test_ci_run_tests_then_runs_the_demo_and_records_the_cache_state(tmp_path):
    (tmp_path / "cache" / "artifacts" / "synth-tiny").mkdir(parents=True)
    (tmp_path / "cache" / "staging").mkdir()  # empty: nothing built there
    done, _ = ci_run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("make ")] == [
        "make test", "make demo", "make demo-down"]
    run = json.loads((tmp_path / "cache" / "reports" / "ci-run.json").read_text())
    assert run["cache_before"] == run["cache_after"] == ["artifacts"], run
    assert run["exit"] == 0 and run["tests_s"] >= 0 and run["demo_s"] >= 0, run


def test_ci_run_refuses_pytest_addopts_it_did_not_set(tmp_path):
    done, made = ci_run(tmp_path, PYTEST_ADDOPTS="-k smoke")
    assert done.returncode == 2, done.stdout + done.stderr
    assert made is None, "make ran"
    assert "refusing to run with PYTEST_ADDOPTS='-k smoke'" in done.stderr and "unset PYTEST_ADDOPTS" in done.stderr

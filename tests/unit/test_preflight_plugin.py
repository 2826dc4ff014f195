"""The checklist's pytest plugin, run for real: pytest + testinfra's local backend on a small fake checklist.

Covers what the fleet checks cannot show in isolation: n/a, blocked dependents, warning vs error, --ignore,
waivers (valid, expired, malformed), the JSON/JUnit reports and the exit status of a plain pytest run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE = '''
from ops.preflight.plugin import check, not_applicable


@check("HOST-REACHABLE")
def test_reachable(host, record_property):
    assert host.run("true").rc == 0
    record_property("found", "local shell works")


@check("CPU-AVX512")
def test_avx512(host):
    assert host.run("false").rc == 0, "no AVX-512 here (fake)"


@check("SWAP-ACTIVE")
def test_swap(host):
    not_applicable("containers cannot enable swap (fake)")


@check("SVC-ACTIVE")
def test_active(host):
    assert host.run("exit 3").rc == 0, "vlfleet.service is inactive/dead (fake)"


@check("SVC-NOFILE")
def test_nofile(host):
    raise RuntimeError("must not run: SVC-ACTIVE failed")


@check("SVC-READYZ")
def test_readyz(host):
    raise RuntimeError("must not run either")


@check("SVC-STREAM")
def test_stream(host):
    raise RuntimeError("blocked through SVC-READYZ")


@check("CLOCK-SYNC")
def test_clock(host):
    assert False, "clock not synchronised (fake)"
'''


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    (tmp_path / "conftest.py").write_text("from ops.preflight.conftest import pytest_addoption, pytest_configure\n")
    (tmp_path / "test_fake.py").write_text(FAKE)
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    # Only testinfra: the venv's other pytest plugins (playwright, ...) cost seconds of start-up per run.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("VLFLEET_REQUIRE_ALL", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "test_fake.py", "--hosts=local://", "-p", "testinfra.plugin",
                           "-p", "no:cacheprovider",
                           "-rxs", f"--preflight-json={out}", f"--preflight-junit={tmp_path / 'report.xml'}",
                           "--preflight-table=plain", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return done, (json.loads(out.read_text()) if out.exists() else None)


def _status(report: dict) -> dict[str, str]:
    return {r["id"]: r["status"] for r in report["results"]}


def test_statuses_blocking_and_exit_code(tmp_path):
    done, report = _run(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _status(report) == {"HOST-REACHABLE": "pass", "CPU-AVX512": "fail", "SWAP-ACTIVE": "n/a",
                               "SVC-ACTIVE": "fail", "SVC-NOFILE": "blocked", "SVC-READYZ": "blocked",
                               "SVC-STREAM": "blocked", "CLOCK-SYNC": "fail"}
    rows = {r["id"]: r for r in report["results"]}
    assert rows["HOST-REACHABLE"]["message"] == "local shell works"
    assert rows["SWAP-ACTIVE"]["message"] == "containers cannot enable swap (fake)"
    assert rows["SVC-ACTIVE"]["message"] == "vlfleet.service is inactive/dead (fake)"
    assert rows["SVC-NOFILE"]["message"].startswith("SVC-ACTIVE failed on this host")
    assert rows["SVC-STREAM"]["message"].startswith("SVC-ACTIVE failed on this host")  # root cause, not the chain
    assert report["summary"]["errors"] == 1 and report["summary"]["warnings"] == 2
    # pytest's own view: the error is a failure with the fix, warnings are xfail, n/a and blocked are skips.
    assert "1 failed, 1 passed, 4 skipped, 2 xfailed" in done.stdout
    assert "SVC-ACTIVE [error] on local: vlfleet.service is inactive/dead (fake)" in done.stdout
    assert "fix: `sudo systemctl start vlfleet`" in done.stdout
    assert "Traceback" not in done.stdout
    table = done.stdout.split("vlfleet preflight", 1)[1]
    assert next(ln for ln in table.splitlines() if ln.startswith("SVC-NOFILE")).split()[-1] == "blocked"
    assert "NOT READY" in table
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "report.xml").getroot().iter("testcase")}
    assert cases["SVC-ACTIVE"].find("failure").get("type") == "error"
    assert cases["CLOCK-SYNC"].find("failure").get("type") == "warning"


def test_ignore_waives_the_error_but_dependents_stay_blocked(tmp_path):
    done, report = _run(tmp_path, "--preflight-ignore=SVC-ACTIVE")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _status(report)["SVC-ACTIVE"] == "waived"
    assert _status(report)["SVC-NOFILE"] == "blocked"
    assert "WAIVED SVC-ACTIVE" in done.stdout


def test_valid_waiver_file_applies_per_host(tmp_path):
    (tmp_path / "w.yml").write_text("- {id: SVC-ACTIVE, reason: maintenance window, expires: 2999-01-01, "
                                    "hosts: [local]}\n- {id: CLOCK-SYNC, reason: other host, expires: 2999-01-01, "
                                    "hosts: [vm9]}\n")
    done, report = _run(tmp_path, f"--preflight-waivers={tmp_path / 'w.yml'}")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["id"]: r for r in report["results"]}
    assert rows["SVC-ACTIVE"]["status"] == "waived" and "maintenance window" in rows["SVC-ACTIVE"]["waiver"]
    assert rows["CLOCK-SYNC"]["status"] == "fail"  # the waiver names another host


def test_expired_waiver_is_an_error(tmp_path):
    (tmp_path / "w.yml").write_text("- {id: SVC-ACTIVE, reason: maintenance window, expires: 2020-01-01}\n")
    done, report = _run(tmp_path, f"--preflight-waivers={tmp_path / 'w.yml'}", "--preflight-ignore=CPU-AVX512")
    assert done.returncode == 1
    assert _status(report)["SVC-ACTIVE"] == "fail"
    assert len(report["waiver_errors"]) == 1 and "SVC-ACTIVE expired on 2020-01-01" in report["waiver_errors"][0]
    assert "ERROR waiver for SVC-ACTIVE expired" in done.stdout


@pytest.mark.parametrize(("content", "message"), [
    ("- {id: SVC-ACTIVE, reason: x}", "`expires` must be a date"),
    ("- {id: WHAT-EVER, reason: x, expires: 2999-01-01}", "unknown check id 'WHAT-EVER'"),
])
def test_malformed_waivers_stop_the_run_with_the_reason(tmp_path, content, message):
    (tmp_path / "w.yml").write_text(content + "\n")
    done, report = _run(tmp_path, f"--preflight-waivers={tmp_path / 'w.yml'}")
    assert done.returncode == 4 and report is None
    assert message in done.stderr

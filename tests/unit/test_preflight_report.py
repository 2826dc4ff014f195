"""ChecklistRun rendering from fake results: table, findings, exit code, JSON round trip, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from ops.preflight import registry
from ops.preflight.results import BLOCKED, FAIL, NA, PASS, WAIVED, ChecklistRun, Result, merge, render_table


def _fleet(overrides: dict | None = None) -> ChecklistRun:
    results = []
    for host in ("c1", "vm1"):
        for c in registry.CHECKS:
            results.append(Result(host, c.id, PASS, "fine"))
    report = ChecklistRun(results, ["c1", "vm1"])
    for (host, cid), (status, msg) in (overrides or {}).items():
        r = report.get(host, cid)
        r.status, r.message = status, msg
        if status == WAIVED:
            r.waiver = "staging (until 2027-01-31) [waivers.yml entry 1]"
    return report


def test_all_pass_is_ready():
    report = _fleet()
    assert report.exit_code == 0
    assert "READY: 2 host(s)" in render_table(report)


def test_warning_does_not_fail_error_does():
    warn = _fleet({("vm1", "CLOCK-SYNC"): (FAIL, "clock not synchronised")})
    assert warn.exit_code == 0 and warn.summary()["warnings"] == 1
    err = _fleet({("vm1", "SWAP-ACTIVE"): (FAIL, "no swap is active")})
    assert err.exit_code == 1 and err.failed_ids("vm1") == ["SWAP-ACTIVE"] and err.failed_ids("c1") == []


def test_waived_na_blocked_do_not_fail():
    report = _fleet({("vm1", "SWAP-ACTIVE"): (WAIVED, "no swap"), ("c1", "SWAP-ACTIVE"): (NA, "container"),
                       ("c1", "SVC-READYZ"): (BLOCKED, "SVC-ACTIVE failed")})
    assert report.exit_code == 0


def test_expired_waiver_and_run_error_fail():
    assert ChecklistRun([], ["c1"], waiver_errors=["waiver for SVC-NOFILE expired"]).exit_code == 1
    assert ChecklistRun([], ["c1"], run_errors=["c1: the checklist could not run"]).exit_code == 1


def test_table_has_a_row_per_check_and_a_column_per_host_and_findings_with_fix():
    report = _fleet({("vm1", "SWAP-ACTIVE"): (FAIL, "no swap is active (/proc/swaps is empty)"),
                       ("c1", "CPU-GOVERNOR"): (NA, "containers cannot see cpufreq")})
    text = render_table(report)
    lines = text.splitlines()
    assert lines[0].split() == ["sev", "c1", "vm1"]
    row = next(ln for ln in lines if ln.startswith("SWAP-ACTIVE"))
    assert row.split() == ["SWAP-ACTIVE", "err", "ok", "FAIL"]
    assert next(ln for ln in lines if ln.startswith("CPU-GOVERNOR")).split()[2] == "n/a"
    assert "vm1 SWAP-ACTIVE [FAIL] no swap is active" in text
    assert "fix: " + registry.get("SWAP-ACTIVE").remediation in text
    assert "c1 CPU-GOVERNOR: containers cannot see cpufreq" in text
    assert text.rstrip().splitlines()[-1].startswith("NOT READY")
    assert "\033[" not in text


def test_colour_only_when_asked():
    report = _fleet({("vm1", "SWAP-ACTIVE"): (FAIL, "x")})
    assert "\033[1;31mFAIL" in render_table(report, color=True)


def test_json_round_trip_and_remediation_only_on_findings(tmp_path):
    report = _fleet({("vm1", "SVC-NOFILE"): (FAIL, "pid 9 may open 1024 files")})
    path = report.write_json(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["exit_code"] == 1 and data["hosts"] == ["c1", "vm1"]
    row = next(r for r in data["results"] if r["host"] == "vm1" and r["id"] == "SVC-NOFILE")
    assert row["severity"] == "error" and row["remediation"] == registry.get("SVC-NOFILE").remediation
    assert next(r for r in data["results"] if r["id"] == "SVC-NOFILE" and r["host"] == "c1")["remediation"] == ""
    back = ChecklistRun.from_json(data)
    assert back.failed_ids("vm1") == ["SVC-NOFILE"] and back.exit_code == 1


def test_merge_keeps_host_order_and_run_errors():
    a = _fleet()
    b = ChecklistRun([], ["vm2"], run_errors=["vm2: the checklist could not run (exited 4)"])
    merged = merge([a, b], ["c1", "vm1", "vm2"])
    assert merged.hosts == ["c1", "vm1", "vm2"] and merged.exit_code == 1


def test_junit_suite_per_host_case_per_check(tmp_path):
    report = _fleet({("vm1", "SWAP-ACTIVE"): (FAIL, "no swap"), ("vm1", "CLOCK-SYNC"): (FAIL, "not synced"),
                       ("c1", "SWAP-ACTIVE"): (NA, "container"), ("c1", "SVC-NOFILE"): (WAIVED, "20000")})
    root = ET.parse(report.write_junit(tmp_path / "r.xml")).getroot()
    suites = {s.get("name"): s for s in root}
    assert set(suites) == {"preflight c1", "preflight vm1"}
    vm1 = {c.get("name"): c for c in suites["preflight vm1"]}
    assert list(vm1) == registry.ids()
    assert vm1["SWAP-ACTIVE"].find("failure").get("type") == "error"
    assert "remediation: " in vm1["SWAP-ACTIVE"].find("failure").text
    assert vm1["CLOCK-SYNC"].find("failure").get("type") == "warning"
    assert suites["preflight vm1"].get("failures") == "2"
    c1 = {c.get("name"): c for c in suites["preflight c1"]}
    assert c1["SWAP-ACTIVE"].find("skipped").get("message") == "container"
    assert c1["SVC-NOFILE"].find("skipped").get("message").startswith("waived: staging")

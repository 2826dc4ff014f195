"""Check results and the reports made from them: terminal table, JSON and JUnit XML, and the exit code.

Statuses: ``pass``; ``fail`` (its severity says whether it blocks launch); ``waived`` (failed, but a waiver
covers it); ``n/a`` (cannot apply on this host, with the reason); ``blocked`` (not run: a check it depends on
failed on this host). The run fails (exit 1) when any error-severity check fails unwaived, or a waiver expired.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.preflight import registry

PASS, FAIL, WAIVED, NA, BLOCKED = "pass", "fail", "waived", "n/a", "blocked"
STATUSES = (PASS, FAIL, WAIVED, NA, BLOCKED)
REPORT_VERSION = 1


@dataclass
class Result:
    host: str
    id: str
    status: str
    message: str = ""  # why it failed / is n/a / is blocked / what was waived; on pass: what was found
    waiver: str = ""  # the waiver that covers a failure (reason, expiry, source)
    duration_s: float = 0.0

    @property
    def check(self) -> registry.Check:
        return registry.get(self.id)

    @property
    def severity(self) -> str:
        return self.check.severity

    @property
    def blocking(self) -> bool:
        """Fails the run: an unwaived failure of an error-severity check."""
        return self.status == FAIL and self.severity == registry.ERROR

    def cell(self) -> str:
        if self.status == FAIL:
            return "FAIL" if self.severity == registry.ERROR else "WARN"
        return {PASS: "ok", WAIVED: "waived", NA: "n/a", BLOCKED: "blocked"}[self.status]

    def to_json(self) -> dict:
        c = self.check
        return {**asdict(self), "severity": c.severity, "description": c.description,
                "remediation": c.remediation if self.status in (FAIL, WAIVED) else ""}


@dataclass
class ChecklistRun:
    results: list[Result]
    hosts: list[str] = field(default_factory=list)  # in inventory order; default: order of first appearance
    waiver_errors: list[str] = field(default_factory=list)  # expired waivers
    run_errors: list[str] = field(default_factory=list)  # a host whose checklist could not run at all
    waivers: dict = field(default_factory=dict)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        for r in self.results:
            if r.host not in self.hosts:
                self.hosts.append(r.host)

    @property
    def exit_code(self) -> int:
        return 1 if (self.waiver_errors or self.run_errors or any(r.blocking for r in self.results)) else 0

    def get(self, host: str, check_id: str) -> Result | None:
        return next((r for r in self.results if r.host == host and r.id == check_id), None)

    def failed_ids(self, host: str) -> list[str]:
        """Ids that failed on ``host`` (any severity, not waived), in registry order: what the e2e tests compare."""
        return [r.id for r in _ordered(self.results) if r.host == host and r.status == FAIL]

    def summary(self) -> dict[str, int]:
        counts = {s: 0 for s in STATUSES}
        for r in self.results:
            counts[r.status] += 1
        counts["errors"] = sum(r.blocking for r in self.results)
        counts["warnings"] = sum(r.status == FAIL and not r.blocking for r in self.results)
        return counts

    def to_json(self) -> dict:
        return {"version": REPORT_VERSION, "exit_code": self.exit_code, "duration_s": round(self.duration_s, 2),
                "hosts": self.hosts, "summary": self.summary(), "waiver_errors": self.waiver_errors,
                "run_errors": self.run_errors, "waivers": self.waivers,
                "checks": [{"id": c.id, "severity": c.severity, "area": c.area, "description": c.description,
                            "depends_on": list(c.depends_on)} for c in registry.CHECKS],
                "results": [r.to_json() for r in _ordered(self.results)]}

    def write_json(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def from_json(cls, data: dict) -> ChecklistRun:
        fields = ("host", "id", "status", "message", "waiver", "duration_s")
        results = [Result(**{k: r[k] for k in fields if k in r}) for r in data.get("results", [])]
        return cls(results, list(data.get("hosts", [])), list(data.get("waiver_errors", [])),
                   list(data.get("run_errors", [])), dict(data.get("waivers", {})), float(data.get("duration_s", 0)))

    def write_junit(self, path: Path | str) -> Path:
        """One <testsuite> per host, one <testcase> per check (name = check id).

        error-severity failures are <failure type="error">, warnings <failure type="warning"> (a JUnit consumer
        sees them; the exit code does not count them); n/a, blocked and waived are <skipped> with the reason.
        """
        suites = ET.Element("testsuites", name="vlfleet preflight")
        for host in self.hosts:
            rows = [r for r in _ordered(self.results) if r.host == host]
            suite = ET.SubElement(suites, "testsuite", name=f"preflight {host}", tests=str(len(rows)),
                                  failures=str(sum(r.status == FAIL for r in rows)), errors="0",
                                  skipped=str(sum(r.status in (NA, BLOCKED, WAIVED) for r in rows)),
                                  time=f"{sum(r.duration_s for r in rows):.3f}")
            for r in rows:
                case = ET.SubElement(suite, "testcase", classname=f"preflight.{host}", name=r.id,
                                     time=f"{r.duration_s:.3f}")
                if r.status == FAIL:
                    el = ET.SubElement(case, "failure", type=r.severity, message=f"{r.id}: {r.message}")
                    el.text = f"{r.check.description}\n{r.message}\nremediation: {r.check.remediation}"
                elif r.status in (NA, BLOCKED, WAIVED):
                    why = f"waived: {r.waiver}; failure: {r.message}" if r.status == WAIVED else r.message
                    ET.SubElement(case, "skipped", type=r.status, message=why)
                elif r.message:
                    ET.SubElement(case, "system-out").text = r.message
        problems = self.waiver_errors + self.run_errors
        if problems:
            suite = ET.SubElement(suites, "testsuite", name="preflight run", tests=str(len(problems)),
                                  failures=str(len(problems)), errors="0", skipped="0")
            for n, text in enumerate(problems, 1):
                case = ET.SubElement(suite, "testcase", classname="preflight.run", name=f"run-problem-{n}")
                ET.SubElement(case, "failure", type="error", message=text).text = text
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
        return path


_COLOURS = {"ok": "32", "FAIL": "1;31", "WARN": "33", "waived": "36", "n/a": "2", "blocked": "35", "-": "2"}


def render_table(report: ChecklistRun, color: bool = False) -> str:
    """Check x host table, then every finding with its remediation, then the verdict line."""
    hosts = report.hosts
    idw = max(len(c.id) for c in registry.CHECKS)
    colw = [max(7, len(h)) for h in hosts]

    def paint(text: str, key: str, width: int) -> str:
        padded = text.ljust(width)
        return f"\033[{_COLOURS[key]}m{padded}\033[0m" if color else padded

    lines = ["  ".join([" " * idw, "sev  ", *(h.ljust(w) for h, w in zip(hosts, colw, strict=True))]).rstrip()]
    for c in registry.CHECKS:
        cells = []
        for h, w in zip(hosts, colw, strict=True):
            r = report.get(h, c.id)
            key = r.cell() if r else "-"
            cells.append(paint(key, key, w))
        lines.append("  ".join([c.id.ljust(idw), ("err " if c.severity == registry.ERROR else "warn").ljust(5),
                                *cells]).rstrip())
    findings = [r for r in _ordered(report.results) if r.status in (FAIL, WAIVED)]
    if findings:
        lines += ["", "Findings:"]
        for r in findings:
            tag = r.cell() if r.status == FAIL else "WAIVED"
            lines.append(f"  {r.host} {r.id} [{tag}] {r.message}")
            lines.append(f"      waiver: {r.waiver}" if r.status == WAIVED else f"      fix: {r.check.remediation}")
            if r.status == FAIL:
                lines.append(f"      more: docs/checklist.md#{r.id.lower()}")
    notes = [r for r in _ordered(report.results) if r.status in (NA, BLOCKED)]
    if notes:
        lines += ["", "Not applicable / blocked:"]
        lines += [f"  {r.host} {r.id}: {r.message}" for r in notes]
    for text in report.waiver_errors + report.run_errors:
        lines.append(("\033[1;31mERROR\033[0m " if color else "ERROR ") + text)
    s = report.summary()
    verdict = "READY" if report.exit_code == 0 else "NOT READY"
    lines += ["", f"{verdict}: {len(hosts)} host(s), {s['pass']} ok, {s['errors']} error(s), {s['warnings']} "
                  f"warning(s), {s['waived']} waived, {s['n/a']} n/a, {s['blocked']} blocked"
                  + (f" in {report.duration_s:.1f} s" if report.duration_s else "")]
    return "\n".join(lines)


def merge(reports: Sequence[ChecklistRun], hosts: Iterable[str] = ()) -> ChecklistRun:
    """One fleet report from per-host reports (the fleet runner runs one pytest per host)."""
    merged = ChecklistRun([r for rep in reports for r in rep.results], list(hosts))
    for rep in reports:
        merged.run_errors += [e for e in rep.run_errors if e not in merged.run_errors]
        merged.waiver_errors += [e for e in rep.waiver_errors if e not in merged.waiver_errors]
        merged.waivers = merged.waivers or rep.waivers
    return merged


def _ordered(results: Iterable[Result]) -> list[Result]:
    order = {cid: n for n, cid in enumerate(registry.ids())}
    return sorted(results, key=lambda r: order.get(r.id, len(order)))

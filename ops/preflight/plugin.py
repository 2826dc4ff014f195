"""pytest plugin for the checklist: check ids, not-applicable and blocked results, waivers, reports, exit code.

Loaded by ops/preflight/conftest.py, so plain ``pytest --hosts=... ops/preflight/test_checklist.py`` gets it.
pytest's own view is kept truthful for a pytest user: an error-severity failure is a failed test; a warning or a
waived failure shows as xfail (``x``) with the reason; n/a and blocked show as skips with the reason. The
exit status follows the checklist's rule (results.ChecklistRun.exit_code), not pytest's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ops.preflight import registry, waivers
from ops.preflight.results import BLOCKED, FAIL, NA, PASS, WAIVED, ChecklistRun, Result, render_table

NA_PREFIX = "not applicable: "
BLOCKED_PREFIX = "blocked: "
MARKER = "preflight_check"


def check(check_id: str) -> pytest.MarkDecorator:
    """Mark a test as the implementation of registry check ``check_id``."""
    registry.get(check_id)  # unknown ids fail at import, not at report time
    return getattr(pytest.mark, MARKER)(check_id)


def not_applicable(reason: str) -> None:
    """End the check as not applicable on this host, with the reason (never pass or fail)."""
    pytest.skip(NA_PREFIX + reason)


def add_options(parser: pytest.Parser) -> None:
    g = parser.getgroup("vlfleet preflight")
    g.addoption("--preflight-json", metavar="FILE", help="write the JSON report here")
    g.addoption("--preflight-junit", metavar="FILE",
                help="write the checklist's JUnit XML here (one testcase per host x check id)")
    g.addoption("--preflight-ignore", metavar="ID,..", default="",
                help="check ids whose failures are waived for this run (like kubeadm --ignore-preflight-errors)")
    g.addoption("--preflight-waivers", metavar="FILE", help="waivers YAML (id, reason, expires, hosts)")
    g.addoption("--preflight-pins", metavar="NAME==VER,..",
                help="runtime pins to expect in the service venv (default: the host extra of pyproject.toml)")
    g.addoption("--preflight-root", default="/opt/vlfleet", help="vlfleet root on the hosts (default: /opt/vlfleet)")
    g.addoption("--preflight-service", default="vlfleet", help="systemd unit name without .service (default: vlfleet)")
    g.addoption("--preflight-min-nofile", type=int, default=65535,
                help="least open-file limit of the running service (default: 65535)")
    g.addoption("--preflight-stream-timeout", type=float, default=120.0,
                help="seconds the streamed answer may take from request to [DONE] (default: 120)")
    g.addoption("--preflight-first-token-timeout", type=float, default=60.0,
                help="seconds to the first streamed token (default: 60)")
    g.addoption("--preflight-table", choices=("auto", "color", "plain", "off"), default="auto",
                help="the host x check table at the end: auto (colour on a TTY), color, plain or off")


class PreflightPlugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: dict[tuple[str, str], Result] = {}
        self.raw_failed: set[tuple[str, str]] = set()  # failed, waived or not: dependents are blocked either way
        self.hosts: list[str] = []
        self.started = time.monotonic()
        try:
            self.waivers = waivers.build(config.getoption("preflight_waivers"),
                                         config.getoption("preflight_ignore"))
        except waivers.WaiverError as e:
            raise pytest.UsageError(str(e)) from e

    # -- collection ---------------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # Registry order, host by host: dependencies run before their dependents on every host.
        order = {cid: n for n, cid in enumerate(registry.ids())}
        for item in items:
            if _check_id(item) is None:
                raise pytest.UsageError(f"{item.nodeid}: a checklist test needs @check(ID) (ops.preflight.plugin)")
        hosts: list[str] = []
        for item in items:
            h = _host_name(item)
            if h not in hosts:
                hosts.append(h)
        self.hosts = hosts
        items.sort(key=lambda it: (hosts.index(_host_name(it)), order[_check_id(it)]))

    # -- running ------------------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        host, cid = _host_name(item), _check_id(item)
        deps = registry.get(cid).depends_on
        if cid != "HOST-REACHABLE":
            deps = ("HOST-REACHABLE", *deps)
        for dep in deps:
            if (host, dep) in self.raw_failed:
                dep_result = self.results[(host, dep)]
                if dep_result.status == BLOCKED:  # name the root cause, not the chain
                    pytest.skip(BLOCKED_PREFIX + dep_result.message)
                pytest.skip(f"{BLOCKED_PREFIX}{dep} failed on this host ({_clip(dep_result.message, 120)})")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        host, cid = _host_name(item), _check_id(item)
        # One result per check: from the call, or from a setup that skipped (n/a, blocked) or failed.
        if (host, cid) in self.results or report.when == "teardown" or (report.when == "setup" and report.passed):
            return
        status, message = _status(report, call, item)
        result = Result(host, cid, status, message, duration_s=round(report.duration, 3))
        if status == BLOCKED:
            self.raw_failed.add((host, cid))  # blocked propagates: SVC-READYZ blocked -> SVC-STREAM blocked
        if status == FAIL:
            self.raw_failed.add((host, cid))
            waiver = self.waivers.find(cid, host)
            if waiver:
                result.status, result.waiver = WAIVED, waiver.describe()
            _reshape(report, result)
        self.results[(host, cid)] = result

    # -- reporting ----------------------------------------------------------------------------------------
    def report(self) -> ChecklistRun:
        return ChecklistRun(list(self.results.values()), list(self.hosts), self.waivers.errors(),
                      waivers=self.waivers.to_json(), duration_s=time.monotonic() - self.started)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config: pytest.Config) -> None:
        if not self.results:
            return
        report = self.report()
        mode = config.getoption("preflight_table")
        if mode != "off":
            color = mode == "color" or (mode == "auto" and terminalreporter.isatty() and sys.stdout.isatty())
            terminalreporter.write_sep("=", "vlfleet preflight")
            terminalreporter.write_line(render_table(report, color=color))
        if config.getoption("preflight_json"):
            report.write_json(config.getoption("preflight_json"))
        if config.getoption("preflight_junit"):
            report.write_junit(config.getoption("preflight_junit"))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Only the checklist's verdict is changed; a usage or internal error of pytest itself stays as it is.
        if self.results and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED if self.report().exit_code else pytest.ExitCode.OK


def _check_id(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker(MARKER)
    return marker.args[0] if marker else None


def _host_name(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    host = callspec.params.get("_testinfra_host") if callspec else None
    if host is None:
        return "local"
    backend = host.backend
    return str(getattr(backend, "hostname", None) or backend.get_pytest_id())


def _status(report: pytest.TestReport, call: pytest.CallInfo, item: pytest.Item) -> tuple[str, str]:
    if report.passed:
        details = [str(v) for k, v in item.user_properties if k == "found"]
        return PASS, "; ".join(details)
    if report.skipped:
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        text = text.removeprefix("Skipped: ")
        if text.startswith(NA_PREFIX):
            return NA, text[len(NA_PREFIX):]
        if text.startswith(BLOCKED_PREFIX):
            return BLOCKED, text[len(BLOCKED_PREFIX):]
        return NA, text
    exc = call.excinfo.value if call.excinfo else None
    if isinstance(exc, AssertionError):
        # The assert's own message; pytest appends its rewritten expression after a newline.
        return FAIL, str(exc).split("\nassert ")[0].strip() or "assertion failed"
    phase = "could not run" if report.when == "setup" else "crashed"
    return FAIL, f"the check {phase}: {type(exc).__name__ if exc else 'error'}: {_clip(str(exc), 400)}"


def _reshape(report: pytest.TestReport, result: Result) -> None:
    """What pytest prints: errors stay failures (no traceback, the fix instead); warnings and waivers -> xfail."""
    check = result.check
    if result.status == WAIVED or check.severity == registry.WARNING:
        label = "WAIVED" if result.status == WAIVED else "WARNING"
        report.outcome = "skipped"
        report.wasxfail = f"{label} {result.id}: {result.message}" + (
            f" (waiver: {result.waiver})" if result.waiver else f"; fix: {check.remediation}")
        report.longrepr = None
    else:
        report.longrepr = f"{result.id} [{check.severity}] on {result.host}: {result.message}\n" \
                          f"fix: {check.remediation}"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(id): the registry check a test implements (ops.preflight)")
    if not config.pluginmanager.has_plugin("vlfleet-preflight"):
        config.pluginmanager.register(PreflightPlugin(config), "vlfleet-preflight")


def default_paths() -> Path:
    """Directory of the checklist test module (for building pytest command lines)."""
    return Path(__file__).resolve().parent

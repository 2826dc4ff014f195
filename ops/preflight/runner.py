"""The fleet run behind `vlfleet preflight` and the preflight role: one pytest per host, in parallel, merged.

One process per host (not pytest-xdist): a slow or unreachable host cannot hold up the others' results, each
host's run is bounded by its own timeout, and its full pytest output is kept beside the reports for debugging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ops.preflight import waivers as waivers_mod
from ops.preflight.results import ChecklistRun, merge

CHECKLIST = Path(__file__).resolve().parent / "test_checklist.py"


class PreflightError(RuntimeError):
    """The run cannot start (bad inventory, pattern, waivers); the message says what to fix."""


@dataclass
class Options:
    ignore: str = ""
    waivers: str | None = None
    pins: str | None = None  # default: the host extra of pyproject.toml (read by the checks)
    stream_timeout: float = 120.0
    host_timeout: float = 900.0  # one host's whole checklist
    extra_args: Sequence[str] = field(default_factory=tuple)


def _bin(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def _env() -> dict[str, str]:
    from ops.playbook import ansible_env

    env = ansible_env()
    # testinfra's ansible:// backend shells out to ansible-inventory: the venv's, not whatever is on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The checklist needs testinfra only (loaded with -p); other installed plugins cost seconds of start-up.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def resolve_hosts(inventory: Path | str, pattern: str = "vlm", timeout: float = 180) -> list[str]:
    """Inventory hosts matching an Ansible pattern ("vlm", "c1,vm1", "vlm:!c2"), in inventory order."""
    inventory = Path(inventory)
    if not inventory.is_file():
        raise PreflightError(f"inventory {inventory} not found: pass --inventory PATH (see inventory.example, or "
                             "the one `vlfleet staging.up` prints)")
    cmd = [_bin("ansible"), pattern, "-i", str(inventory), "--list-hosts"]
    try:
        done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise PreflightError(f"`ansible {pattern} --list-hosts` took more than {timeout:.0f} s; is the controller "
                             "overloaded or the inventory a slow dynamic script?") from e
    hosts = [ln.strip() for ln in done.stdout.splitlines()[1:] if ln.strip()]
    if done.returncode != 0 or not hosts:
        raise PreflightError(f"no host of {inventory} matches {pattern!r}: pass --hosts with inventory host or group "
                             f"names, comma-separated\n{done.stderr.strip()}")
    return hosts


def pytest_argv(host: str, inventory: Path | str, opts: Options, json_path: Path) -> list[str]:
    argv = [sys.executable, "-m", "pytest", str(CHECKLIST), "-p", "testinfra.plugin", "-p", "no:cacheprovider", "-q",
            "-rN",
            f"--hosts=ansible://{host}", f"--ansible-inventory={inventory}", f"--preflight-json={json_path}",
            "--preflight-table=off", f"--preflight-stream-timeout={opts.stream_timeout}"]
    if opts.ignore:
        argv.append(f"--preflight-ignore={opts.ignore}")
    if opts.waivers:
        argv.append(f"--preflight-waivers={opts.waivers}")
    if opts.pins:
        argv.append(f"--preflight-pins={opts.pins}")
    return [*argv, *opts.extra_args]


def run_host(host: str, inventory: Path | str, opts: Options, out_dir: Path) -> ChecklistRun:
    json_path, log_path = out_dir / f"{host}.json", out_dir / f"{host}.log"
    argv = pytest_argv(host, inventory, opts, json_path)
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(argv, env=_env(), cwd=CHECKLIST.parents[2], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=opts.host_timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    if json_path.is_file():
        report = ChecklistRun.from_json(json.loads(json_path.read_text()))
        if code is None:
            report.run_errors.append(f"{host}: checklist stopped after {opts.host_timeout:.0f} s (log: {log_path})")
        return report
    tail = " | ".join(log_path.read_text().strip().splitlines()[-6:])[-600:]
    what = f"timed out after {opts.host_timeout:.0f} s" if code is None else f"exited {code}"
    return ChecklistRun([], [host],
                        run_errors=[f"{host}: the checklist could not run ({what}): {tail} (log: {log_path})"])


def run_fleet(inventory: Path | str, hosts: Sequence[str], opts: Options, out_dir: Path | None = None,
              jobs: int = 0, on_host: Callable[[str, ChecklistRun], None] | None = None) -> ChecklistRun:
    """Every host's checklist, ``jobs`` at a time (0: all at once, up to 16); one merged report."""
    # Fail fast on unusable waivers here, with the same message every per-host run would give.
    try:
        waivers_mod.build(opts.waivers, opts.ignore)
    except waivers_mod.WaiverError as e:
        raise PreflightError(str(e)) from e
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="vlfleet-preflight-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def one(host: str) -> ChecklistRun:
        report = run_host(host, inventory, opts, out_dir)
        if on_host:
            on_host(host, report)
        return report

    with ThreadPoolExecutor(max_workers=jobs or min(16, len(hosts))) as pool:
        reports = list(pool.map(one, hosts))
    merged = merge(reports, hosts)
    merged.duration_s = time.monotonic() - started
    return merged


def run_and_report(inventory: Path | str, hosts: str = "vlm", opts: Options | None = None, *,
                   junit: str | None = None, json_out: str | None = None, jobs: int = 0, logs: str | None = None,
                   color: bool = False, echo: Callable[[str], None] = print) -> ChecklistRun:
    """The whole fleet run as `vlfleet preflight`, `python -m ops.preflight` and the preflight role do it:
    resolve hosts, run, print progress and the table, write the reports. Raises PreflightError on bad input."""
    opts = opts or Options()
    if opts.waivers:
        # Absolute: each host's pytest runs from the repository root, not from the caller's directory.
        opts.waivers = str(Path(opts.waivers).expanduser().resolve())
        if not Path(opts.waivers).is_file():
            raise PreflightError(f"waivers file {opts.waivers} not found; see docs/checklist.md (Waivers) for the "
                                 "format")
    inv = Path(inventory).expanduser().resolve()
    names = resolve_hosts(inv, ",".join(h.strip() for h in hosts.split(",") if h.strip()) or "vlm")
    out_dir = Path(logs).expanduser() if logs else Path(tempfile.mkdtemp(prefix="vlfleet-preflight-"))
    echo(f"[preflight] checking {len(names)} host(s): {', '.join(names)} (per-host pytest output in {out_dir})")
    report = run_fleet(inv, names, opts, out_dir=out_dir, jobs=jobs, on_host=lambda h, r: echo(
        f"[preflight] {h}: done, {len(r.failed_ids(h))} failed" + (f"; {r.run_errors[0]}" if r.run_errors else "")))
    from ops.preflight.results import render_table

    echo(render_table(report, color=color))
    if json_out:
        echo(f"[preflight] JSON report: {report.write_json(Path(json_out).expanduser())}")
    if junit:
        echo(f"[preflight] JUnit XML: {report.write_junit(Path(junit).expanduser())}")
    return report

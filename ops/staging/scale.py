"""`vlfleet staging.scale`: measure an N-host staging fleet (issue 17, "Scale, measured").

What it times, on a fleet of N container service hosts c1..cN and the load balancer lb1 (no VMs):

- **one host's converge**: site.yml limited to ``c1,lb1`` on fresh hosts, i.e. a one-service-host fleet from bare
  to serving behind its nginx (the lb play is part of every converge, so it is in both timings);
- **the whole fleet's converge**: site.yml on every host right after, c1 and lb1 already converged (nothing to
  change there), c2..cN fresh: what N hosts cost when Ansible runs them in parallel. The goal is at most twice
  one host's time (``GOAL_RATIO``);
- **a rollout** of a new release (`ops.fleet.rollout`, batches ``1,25%,50%``) to all N hosts while a steady client
  loop (`ops.fleet.load.Load`) sends chat requests through lb1's nginx: every one must succeed.

The numbers go to ``results/scale/scale-<N>-hosts.json`` and a generated ``.md`` beside it, with the machine
(`ops.machine.describe`), the date, the fleet and inventory used. The pure parts (Ansible settings, ratio, report,
markdown) are separate from the steps that need a fleet, and tested on their own.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

GOAL_RATIO = 2.0  # the whole fleet's converge against one host's
BATCH = "1,25%,50%"
CONVERGE_TIMEOUT = 3600.0  # per site.yml run
READY_TIMEOUT = 900  # vlm_service_ready_timeout during the converge (as the e2e tests)
DRAIN_TIMEOUT = 60.0  # rollout timeouts, as the rollout e2e test
ROLLOUT_READY_TIMEOUT = 600.0
LOAD_MAX_SECONDS = 4 * 3600  # the client loop's own bound; the rollout is bounded by its per-host timeouts
LOAD_MAX_REQUESTS = 100_000
STEPS = 5  # numbered steps; writing the results and `down` follow


class ScaleError(RuntimeError):
    """A step of the measurement failed; the message names it. What was measured before is written all the same."""


# --- pure parts ------------------------------------------------------------------------------------------------
def one_host_limit(lb: str = "lb1") -> str:
    """The ``--limit`` of the one-host converge: c1 and the load balancer, whose play every converge runs."""
    return f"c1,{lb}"


def ansible_settings(cfg_text: str, environ: Mapping[str, str] | None = None) -> dict:
    """What ansible-playbook will use for parallelism and SSH reuse: ``forks``, ``pipelining``, ``control_persist``
    from the project's ansible.cfg text, with ANSIBLE_FORKS / ANSIBLE_PIPELINING / ANSIBLE_SSH_ARGS from
    ``environ`` winning as they do for Ansible."""
    environ = environ or {}
    cfg = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    cfg.read_string(cfg_text)
    forks = environ.get("ANSIBLE_FORKS") or cfg.get("defaults", "forks", fallback="5")
    pipelining = environ.get("ANSIBLE_PIPELINING") or cfg.get("ssh_connection", "pipelining", fallback="False")
    ssh_args = environ.get("ANSIBLE_SSH_ARGS") or cfg.get("ssh_connection", "ssh_args", fallback="")
    persist = re.search(r"ControlPersist=(\S+)", ssh_args)
    return {"forks": int(forks), "pipelining": pipelining.strip().lower() in ("true", "yes", "1", "on"),
            "control_persist": persist.group(1) if persist else None}


def others(hosts: int) -> str:
    """The service hosts besides c1, as the report names them: "c2" or "c2..cN"."""
    return "c2" if hosts == 2 else f"c2..c{hosts}"


def forks_needed(hosts: int, lb: bool = True) -> int:
    """Forks for every host of the fleet to run a task at the same time (N service hosts and the lb)."""
    return hosts + int(lb)


def converge_ratio(one_s: float | None, all_s: float | None) -> float | None:
    """The whole fleet's converge time over one host's (None until both are measured)."""
    if not one_s or all_s is None:
        return None
    return round(all_s / one_s, 2)


def judge(ratio: float | None, goal: float = GOAL_RATIO) -> dict:
    return {"ratio": ratio, "goal": f"<= {goal:g}x", "met": None if ratio is None else ratio <= goal}


@dataclass
class Measurement:
    """Everything measured so far; `build_report` turns it into the result file's content."""

    hosts: int
    name: str
    machine: dict = field(default_factory=dict)
    started: str = ""
    finished: str = ""
    steps: dict[str, float] = field(default_factory=dict)  # step -> seconds (a failed step: up to its failure)
    fleet: dict = field(default_factory=dict)
    ansible: dict = field(default_factory=dict)
    converge: dict[str, dict] = field(default_factory=dict)  # "one" / "all" -> what the run did
    rollout: dict = field(default_factory=dict)
    error: str = ""
    failed_step: str = ""
    loadavg_end: str = ""


def build_report(m: Measurement) -> dict:
    """The JSON result: machine, N, timed steps, converge ratio against the goal, rollout counts, date, fleet."""
    one, every = m.converge.get("one", {}), m.converge.get("all", {})
    ratio = converge_ratio(one.get("seconds") if one.get("ok") else None,
                           every.get("seconds") if every.get("ok") else None)
    verdict = judge(ratio)
    fresh = m.fleet.get("converged_before") == []
    if ratio is not None and not fresh:
        verdict["note"] = ("hosts were converged before this run (a reused fleet): these are re-converges, not "
                           "fresh ones; `vlfleet staging.scale --fresh` measures from bare hosts")
    return {
        "what": "vlfleet staging.scale",
        "version": 1,
        "ok": not m.error,
        "error": m.error,
        "failed_step": m.failed_step,
        "date": m.started,
        "finished": m.finished,
        "machine": {**m.machine, **({"loadavg_end": m.loadavg_end} if m.loadavg_end else {})},
        "hosts": m.hosts,
        "fleet": {"name": m.name, **m.fleet},
        "ansible": m.ansible,
        "steps_s": {k: round(v, 1) for k, v in m.steps.items()},
        "converge": {"one_host": one, "all_hosts": every, **verdict},
        "rollout": m.rollout,
    }


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}" if isinstance(value, (int, float)) else str(value)


STEP_TEXT = {
    "fleet_up": "fleet up (`staging.up`)",
    "prepare": "model artifact, hosts' Python, wheelhouse, fresh-host check",
    "converge_one": "converge one host (site.yml --limit {limit})",
    "converge_all": "converge all {n} hosts (site.yml{fresh})",
    "rollout": "rollout to all {n} hosts under client load",
    "fleet_down": "fleet down (`staging.down`)",
}


def render_markdown(report: dict) -> str:
    """The short human summary written beside the JSON (generated: edit this function, not the file)."""
    n = report["hosts"]
    fleet, conv, ro, mach = report["fleet"], report["converge"], report["rollout"], report["machine"]
    fresh_note = f", {others(n)} fresh" if fleet.get("converged_before") == [] else ""
    lines = [f"# Staging scale: {n} hosts", "",
             f"Generated by `vlfleet staging.scale --hosts {n}` (ops/staging/scale.py) from "
             f"`scale-{n}-hosts.json`; do not edit.", "",
             f"- date: {report['date']} (finished {report['finished'] or '-'})",
             f"- machine: {mach.get('cpu', '?')}, {mach.get('cpus', '?')} CPUs, ISA {' '.join(mach.get('isa', []))}; "
             f"load {mach.get('loadavg', '?')} at start, {mach.get('loadavg_end', '?')} at the end",
             f"- fleet `{fleet['name']}`: {', '.join(fleet.get('service_hosts', [])) or '-'} (containers) + "
             f"{', '.join(fleet.get('lb_hosts', [])) or '-'}; inventory `{fleet.get('inventory', '-')}`",
             f"- ansible: forks {report['ansible'].get('forks', '-')}, pipelining "
             f"{'on' if report['ansible'].get('pipelining') else 'off'}, ControlPersist "
             f"{report['ansible'].get('control_persist') or '-'}", "",
             "| step | seconds |", "|---|---:|"]
    limit = conv.get("one_host", {}).get("limit", one_host_limit())
    for step, seconds in report["steps_s"].items():
        text = STEP_TEXT.get(step, step).format(limit=limit, n=n, fresh=fresh_note)
        failed = " (failed)" if step == report["failed_step"] else ""
        lines.append(f"| {text}{failed} | {_s(seconds)} |")
    lines.append("")
    if conv.get("ratio") is not None:
        met = "met" if conv["met"] else "NOT met"
        lines.append(f"**Converge**: all {n} hosts / one host = {conv['all_hosts']['seconds']:.0f} s / "
                     f"{conv['one_host']['seconds']:.0f} s = **{conv['ratio']:.2f}x** (goal {conv['goal']}: {met}).")
        if conv.get("note"):
            lines.append(f"Note: {conv['note']}.")
    else:
        lines.append(f"**Converge**: ratio not measured (goal {conv['goal']}).")
    lines.append("")
    if ro.get("requests") is not None:
        lines.append(f"**Rollout** `{ro.get('release')}` (batches {ro.get('batch')}): {ro.get('hosts_on_release', 0)}/"
                     f"{ro.get('hosts', 0)} hosts on it in {_s(ro.get('seconds'))} s"
                     f"{'' if ro.get('ok') else ' (' + (ro.get('summary') or 'failed') + ')'}; "
                     f"{ro['requests']} requests ({ro.get('streamed', 0)} streamed) through nginx, "
                     f"**{ro.get('failures')} failed**; first token p50 {_s3(ro.get('p50_first_token_s'))} s, "
                     f"p95 {_s3(ro.get('p95_first_token_s'))} s.")
    else:
        lines.append("**Rollout**: not run.")
    if report["error"]:
        lines += ["", f"**Failed** at `{report['failed_step'] or '?'}`: {report['error']}"]
    return "\n".join(lines) + "\n"


def _s3(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def result_paths(out_dir: Path, hosts: int) -> tuple[Path, Path]:
    stem = Path(out_dir) / f"scale-{hosts}-hosts"
    return stem.with_suffix(".json"), stem.with_suffix(".md")


def write_results(report: dict, out_dir: Path) -> tuple[Path, Path]:
    json_path, md_path = result_paths(out_dir, report["hosts"])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def converge_record(run, seconds: float, limit: str | None) -> dict:
    """What one site.yml run did: wall time, ok, the callback's duration, per-host recap, the slowest roles."""
    roles = sorted(run.roles.items(), key=lambda kv: -kv[1])[:6]
    return {"limit": limit or "all", "seconds": round(seconds, 1), "ok": run.ok, "returncode": run.returncode,
            "ansible_duration_s": round(run.duration, 1),
            "recap": {h: {k: v for k, v in c.items() if k in ("ok", "changed", "failures", "unreachable")}
                      for h, c in run.recap.items()},
            "slowest_roles_s": {r: round(s, 1) for r, s in roles}}


def rollout_record(report, summary: dict, release: str, load_s: float) -> dict:
    from ops.fleet import Outcome

    outcomes: dict[str, int] = {}
    for r in report.results:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
    return {"release": release, "batch": BATCH, "batches": report.batches, "ok": report.ok,
            "summary": report.summary(), "seconds": round(report.seconds, 1), "hosts": len(report.results),
            "hosts_on_release": sum(r.outcome in (Outcome.OK, Outcome.UNCHANGED) for r in report.results),
            "outcomes": outcomes,
            "per_host": [{"host": r.host, "batch": r.batch, "result": r.outcome.value, "seconds": round(r.seconds, 1)}
                         for r in report.results],
            "load_s": round(load_s, 1), **summary}


# --- the steps on a real fleet ---------------------------------------------------------------------------------
class _Run:
    def __init__(self, m: Measurement, echo: Callable[[str], None]) -> None:
        self.m, self.echo, self.n = m, echo, 0

    @contextmanager
    def step(self, key: str, text: str) -> Iterator[None]:
        self.n += 1
        self.echo(f"\n[scale {self.n}/{STEPS}] {text} ...")
        t0 = time.monotonic()
        try:
            yield
        except BaseException:
            self.m.failed_step = key
            raise
        finally:
            self.m.steps[key] = time.monotonic() - t0
            self.echo(f"[scale {self.n}/{STEPS}] {key}: {self.m.steps[key]:.0f} s")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run(name: str = "scale", hosts: int = 8, *, keep: bool = False, fresh: bool = False,
        out_dir: Path | None = None, converge_timeout: float = CONVERGE_TIMEOUT,
        echo: Callable[[str], None] = print) -> tuple[dict, tuple[Path, Path]]:
    """Measure fleet ``name`` with ``hosts`` service hosts; write the results; bring it down unless ``keep``.

    Returns the report and the paths written. Raises ScaleError (after writing what was measured) when a step
    fails, the rollout leaves a host behind or a client request fails.
    """
    from ops import machine
    from ops.paths import repo_root
    from ops.staging import fleet as staging
    from ops.staging.network import MAX_CONTAINERS

    if not 2 <= hosts <= MAX_CONTAINERS:
        raise ScaleError(f"--hosts must be 2..{MAX_CONTAINERS} (one host's converge is the baseline), got {hosts}")
    out_dir = Path(out_dir) if out_dir else repo_root() / "results" / "scale"
    m = Measurement(hosts=hosts, name=name, machine=machine.describe(), started=_now())
    r = _Run(m, echo)
    try:
        _measure(r, name, hosts, fresh, converge_timeout)
    except KeyboardInterrupt:
        m.error = "interrupted (Ctrl-C)"
        raise
    except Exception as e:  # any failure: say which step, keep what was measured
        known = isinstance(e, _expected_errors())
        if not known:
            traceback.print_exc()
        m.error = str(e) if known else f"{type(e).__name__}: {e}"
    finally:
        m.finished, m.loadavg_end = _now(), machine.describe()["loadavg"]
        paths = write_results(build_report(m), out_dir)
        echo(f"\n[scale] results: {paths[0]} and {paths[1].name}")
        if not keep:
            echo(f"[scale] bringing fleet {name!r} down (--keep keeps it) ...")
            t0 = time.monotonic()
            try:
                problems = staging.down(name)
            except Exception as e:  # reported like what down could not remove
                problems = [f"{type(e).__name__}: {e}"]
            m.steps["fleet_down"] = time.monotonic() - t0
            if problems:
                m.error = (m.error + "; " if m.error else "") + "staging.down left: " + "; ".join(problems)
                m.failed_step = m.failed_step or "fleet_down"
            paths = write_results(build_report(m), out_dir)
        else:
            echo(f"[scale] fleet {name!r} kept: `vlfleet staging.down --name {name}` removes it")
    report = build_report(m)
    echo("\n" + render_markdown(report))
    if m.error:
        raise ScaleError(f"{m.failed_step or 'scale'}: {m.error}\n(what was measured is in {paths[0]})")
    return report, paths


def _measure(r: _Run, name: str, hosts: int, fresh: bool, converge_timeout: float) -> None:
    from ops.model.cache import tiny_artifact
    from ops.paths import repo_root
    from ops.playbook import host_python_versions, run_playbook
    from ops.staging import fleet as staging
    from ops.staging.converge_vars import site_vars

    m, echo = r.m, r.echo
    with r.step("fleet_up", f"bringing up staging fleet {name!r}: {hosts} containers, 0 VMs, lb1"):
        if fresh and staging.get(name) is not None:
            echo(f"  --fresh: removing the running fleet {name!r} first")
            problems = staging.down(name)
            if problems:
                raise ScaleError(f"--fresh: could not remove fleet {name!r}: {'; '.join(problems)}")
        existed = staging.get(name) is not None
        fl = staging.up(name, containers=hosts, vms=0, lb=True)
        m.fleet = {"inventory": str(fl.inventory_path), "subnet": fl.subnet, "reused": existed,
                   "service_hosts": [h.name for h in fl.group("vlm")], "lb_hosts": [h.name for h in fl.group("lb")]}
    inventory = fl.inventory_path
    lb = m.fleet["lb_hosts"][0]

    with r.step("prepare", "model artifact (tiny, cached), hosts' Python, wheelhouse, which hosts are fresh"):
        artifact = tiny_artifact()
        python = min(host_python_versions(inventory).values())
        extra = site_vars(artifact, python, READY_TIMEOUT)
        m.fleet["converged_before"] = _converged_hosts(inventory)
        m.fleet.update({"artifact": str(artifact), "python": python, "wheelhouse": extra["vlfleet_wheelhouse_dir"]})
        if m.fleet["converged_before"]:
            echo(f"  note: {', '.join(m.fleet['converged_before'])} already run a release: the converges below are "
                 f"re-converges (--fresh starts from bare hosts)")
        settings = ansible_settings((repo_root() / "ansible.cfg").read_text(), os.environ)
        env = {}
        if settings["forks"] < forks_needed(hosts):
            # Fewer forks than hosts would run the hosts in waves and time Ansible's setting, not the fleet.
            env["ANSIBLE_FORKS"] = str(forks_needed(hosts))
            echo(f"  ansible.cfg forks = {settings['forks']} < {forks_needed(hosts)} hosts: ANSIBLE_FORKS="
                 f"{env['ANSIBLE_FORKS']} for these runs")
        m.ansible = {**settings, "forks_configured": settings["forks"], "forks": int(env.get("ANSIBLE_FORKS",
                                                                                           settings["forks"]))}

    limit = one_host_limit(lb)
    with r.step("converge_one", f"site.yml limited to {limit} (one service host and the lb)"):
        t0 = time.monotonic()
        run = run_playbook(inventory, "site.yml", extra, limit=limit, timeout=converge_timeout, echo=echo, env=env)
        m.converge["one"] = converge_record(run, time.monotonic() - t0, limit)
        if not run.ok:
            raise ScaleError(f"site.yml --limit {limit} failed (exit {run.returncode}):\n{run.summary()}")

    with r.step("converge_all", f"site.yml on all {hosts} hosts and lb1 ({others(hosts)} fresh)"):
        t0 = time.monotonic()
        run = run_playbook(inventory, "site.yml", extra, timeout=converge_timeout, echo=echo, env=env)
        m.converge["all"] = converge_record(run, time.monotonic() - t0, None)
        if not run.ok:
            raise ScaleError(f"site.yml on all hosts failed (exit {run.returncode}):\n{run.summary()}")
    ratio = converge_ratio(m.converge["one"]["seconds"], m.converge["all"]["seconds"])
    echo(f"  converge: all {hosts} / one = {ratio}x (goal <= {GOAL_RATIO:g}x)")

    with r.step("rollout", f"rollout of a new release to all {hosts} hosts, clients looping through {lb}'s nginx"):
        _rollout(m, inventory, lb, echo)


def _expected_errors() -> tuple[type[Exception], ...]:
    """The errors whose message says it all (no traceback): a step's own, staging, ansible, fleet, wheelhouse."""
    from ops.fleet import FleetError, StepError
    from ops.playbook import PlaybookError
    from ops.staging.system import StagingError
    from ops.wheelhouse import WheelhouseError

    return ScaleError, StagingError, PlaybookError, FleetError, StepError, WheelhouseError


def _converged_hosts(inventory: Path) -> list[str]:
    """The service hosts that already run a release (a reused fleet), by the host program's describe."""
    from ops.fleet import Fleet, load_inventory

    with Fleet(load_inventory(inventory), echo=None) as f:
        return [h.name for h in f.hosts if f.describe(h.name).get("current")]


def _rollout(m: Measurement, inventory: Path, lb: str, echo: Callable[[str], None]) -> None:
    from ops.fleet import Fleet, Release, Timeouts, load_inventory, rollout
    from ops.fleet.load import Load

    inv = load_inventory(inventory)
    release = f"scale-{int(time.time())}"
    timeouts = Timeouts(drain=DRAIN_TIMEOUT, ready=ROLLOUT_READY_TIMEOUT)
    t0 = time.monotonic()
    with Fleet(inv, timeouts=timeouts, echo=echo) as f, \
            Load(inv.hosts[lb].address, max_seconds=LOAD_MAX_SECONDS, max_requests=LOAD_MAX_REQUESTS) as load:
        time.sleep(3)  # traffic flowing before the first drain
        report = rollout(f, Release(release), batch=BATCH)
        time.sleep(2)
    summary = load.summary()
    m.rollout = rollout_record(report, summary, release, time.monotonic() - t0)
    echo("\n" + report.table())
    echo(f"  {report.summary()}; {summary['requests']} requests, {summary['failures']} failed")
    problems = []
    if not report.ok:
        problems.append(report.summary())
    if summary["failures"]:
        problems.append(f"{summary['failures']} of {summary['requests']} client requests failed, e.g. "
                        f"{json.dumps(summary['failed'][:2])}")
    if not summary["streamed"]:
        problems.append("no streamed request completed during the rollout")
    if problems:
        raise ScaleError("; ".join(problems))

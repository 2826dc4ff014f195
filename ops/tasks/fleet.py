"""`vlfleet rollout | rollback | restart | status | logs | tune`: operate a serving fleet (see docs/operations.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from invoke import Exit, task

from service.runtime.contract import ENGINES

COMMON_HELP = {
    "inventory": "Ansible inventory with groups vlm and lb (default: ./inventory.yml)",
    "batch": "batch sizes, Ansible serial style: counts or percentages; the last repeats (default 1,25%,50%: "
             "a canary host, then a quarter of the fleet, then halves)",
    "max_fail": "stop before the next batch once more hosts than this failed: a count or a percentage "
                "(default 0: the first failure stops the rollout)",
    "parallel": "hosts of a batch changed at the same time, at most (default 4)",
    "only": "only these vlm hosts, comma-separated (default: all of group vlm, in inventory order)",
    "drain_timeout": "seconds a drained host's in-flight requests get to finish before the restart (default 60)",
    "ready_timeout": "seconds a restarted host gets to answer /readyz and a smoke request (default 600)",
    "yes": "do not ask for confirmation",
    "dry": "show the plan (batches, what each host runs now) and change nothing",
}


def _open_fleet(inventory: str, only: str | None, drain_timeout: float = 60, ready_timeout: float = 600):
    from ops.fleet import Fleet, FleetError, Timeouts, load_inventory

    try:
        return Fleet(load_inventory(Path(inventory)), limit=[h for h in (only or "").split(",") if h] or None,
                     timeouts=Timeouts(drain=float(drain_timeout), ready=float(ready_timeout)))
    except FleetError as e:
        raise Exit(f"vlfleet: {e}") from e


def _plan(fleet, batch: str, action: str, target: str, yes: bool, dry: bool) -> None:
    from ops.fleet import status, status_table
    from ops.fleet.batches import RolloutError, plan_batches

    try:
        batches = plan_batches([h.name for h in fleet.hosts], batch)
    except RolloutError as e:
        raise Exit(f"vlfleet {action}: {e}") from e
    print(status_table(status(fleet)))
    print(f"\n{action} {target}: " + " | ".join(f"batch {i}: {', '.join(b)}" for i, b in enumerate(batches, 1)))
    if dry:
        raise Exit("dry run: nothing changed", code=0)
    if not yes and sys.stdin.isatty() and input("Go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
        raise Exit("Aborting.")


def _finish(report) -> None:
    print("\n" + report.table())
    print(report.summary())
    if not report.ok:
        raise Exit(f"vlfleet {report.action}: not every host made it; see the table above", code=1)


@task(help={
    **COMMON_HELP,
    "release": "release id to roll out (names /opt/vlfleet/releases/<id>); required",
    "wheelhouse": "wheelhouse directory with new code or pins (default: reuse the venv of each host's current "
                  "release)",
    "artifact": "model artifact directory to switch to (default: keep each host's current model)",
    "env": "VLFLEET_* settings that differ from the current release, KEY=VALUE,KEY2=VALUE2 (KEY= removes one)",
    "keep": "releases kept per host after a successful change, besides current and previous (default 3)",
})
def rollout(c, release, inventory="inventory.yml", wheelhouse=None, artifact=None, env=None, batch="1,25%,50%",
            max_fail="0", parallel=4, only=None, drain_timeout=60, ready_timeout=600, keep=3, yes=False, dry=False):
    """Roll a release out: canary, then batches; per host drain, install, restart, gate, undrain (or roll back)."""
    from ops import fleet as ops_fleet
    from ops.fleet.batches import RolloutError

    try:
        rel = ops_fleet.Release(release, Path(wheelhouse).expanduser() if wheelhouse else None,
                                Path(artifact).expanduser() if artifact else None, ops_fleet.parse_env_option(env))
    except ops_fleet.FleetError as e:
        raise Exit(f"vlfleet rollout: {e}") from e
    with _open_fleet(inventory, only, drain_timeout, ready_timeout) as fleet:
        _plan(fleet, batch, "rollout", release, yes, dry)
        try:
            report = ops_fleet.rollout(fleet, rel, batch=batch, max_fail=max_fail, parallel=int(parallel),
                                       keep=int(keep))
        except RolloutError as e:
            raise Exit(f"vlfleet rollout: {e}") from e
    _finish(report)


@task(help={**COMMON_HELP, "to": "release to go back to (default: each host's previous release)"})
def rollback(c, to=None, inventory="inventory.yml", batch="1,25%,50%", max_fail="0", parallel=4, only=None,
             drain_timeout=60, ready_timeout=600, yes=False, dry=False):
    """Put the hosts back on their previous release (or --to RELEASE), rolling, with the same gates."""
    from ops import fleet as ops_fleet
    from ops.fleet.batches import RolloutError

    with _open_fleet(inventory, only, drain_timeout, ready_timeout) as fleet:
        _plan(fleet, batch, "rollback", to or "previous release", yes, dry)
        try:
            report = ops_fleet.rollback(fleet, to, batch=batch, max_fail=max_fail, parallel=int(parallel))
        except RolloutError as e:
            raise Exit(f"vlfleet rollback: {e}") from e
    _finish(report)


@task(help={**COMMON_HELP, "batch": "batch sizes as for rollout (default 1: one host at a time)"})
def restart(c, inventory="inventory.yml", batch="1", max_fail="0", parallel=4, only=None, drain_timeout=60,
            ready_timeout=600, yes=False, dry=False):
    """Restart the service host by host: drain, restart, wait for /readyz and a smoke answer, undrain."""
    from ops import fleet as ops_fleet
    from ops.fleet.batches import RolloutError

    with _open_fleet(inventory, only, drain_timeout, ready_timeout) as fleet:
        _plan(fleet, batch, "restart", "current release", yes, dry)
        try:
            report = ops_fleet.restart(fleet, batch=batch, max_fail=max_fail, parallel=int(parallel))
        except RolloutError as e:
            raise Exit(f"vlfleet restart: {e}") from e
    _finish(report)


@task(name="status", help={"inventory": COMMON_HELP["inventory"], "only": COMMON_HELP["only"],
                           "json": "print the rows as JSON instead of a table"})
def status_(c, inventory="inventory.yml", only=None, json_=False):
    """Per host: release, artifact, ready, queue depth, uptime, RSS, first-token p50 (from /metrics)."""
    from ops.fleet import status, status_table

    with _open_fleet(inventory, only) as fleet:
        rows = status(fleet)
    print(json.dumps(rows, indent=1) if json_ else status_table(rows))
    if any("error" in r or not r.get("ready") for r in rows):
        raise Exit(code=1)


@task(help={
    "inventory": COMMON_HELP["inventory"],
    "limit": "only these vlm hosts, comma-separated (default: all of group vlm)",
    "tokens": "tokens per timed answer (default 128; each answer has exactly this many)",
    "runs": "timed answers per engine; the score is their median time to the whole answer (default 3)",
    "clients": "answers asked at once in each run, as the host's users would (default 1); with more than one, the "
               "batching engine is a candidate too and the score is the median answer's time under that load",
    "followups": "follow-up questions about the same picture after each first one, in its conversation (0-3, "
                 "default 0), as chat users ask them: the score then counts those answers too, so an engine that "
                 "keeps a conversation's image and KV is timed doing so",
    "engines": f"candidate engines, comma-separated (default: {','.join(ENGINES)} with batching skipped for one "
               "client and llamacpp only where the host has a llama-server and a GGUF artifact)",
    "engine": "pin this engine on every host: only start, verify and record it (a host's `vlfleet_engine` "
              "inventory var pins it for that host)",
    "out": "directory for the controller's copy of each record, tune-<host>.json (default: $VLFLEET_CACHE/reports)",
    "parallel": "hosts tuned at the same time, at most (default 4; hosts sharing CPUs skew each other's numbers)",
    "ready_timeout": "seconds one restart may take to answer /readyz (default 600)",
    "probe_timeout": "seconds one timed answer may take (default 300)",
    "yes": COMMON_HELP["yes"],
})
def tune(c, inventory="inventory.yml", limit=None, tokens=128, runs=3, clients=1, followups=0, engines=None,
         engine=None, out=None, parallel=4, ready_timeout=600, probe_timeout=300, yes=False):
    """Measure each engine on each host, run the fastest within the memory budget, record the choice."""
    from ops.fleet import FleetError, status, status_table
    from ops.fleet import tune as tuning
    from ops.host.probe import FOLLOWUP_QUESTIONS

    try:
        opts = tuning.Options(engines=tuning.parse_engines(engines), engine=engine or None, tokens=int(tokens),
                              runs=int(runs), clients=int(clients), followups=int(followups),
                              probe_timeout=float(probe_timeout), parallel=int(parallel),
                              out=Path(out).expanduser() if out else None)
        if opts.engine:
            tuning.parse_engines(opts.engine)
    except (FleetError, ValueError) as e:
        raise Exit(f"vlfleet tune: {e}") from e
    if opts.tokens < 2 or opts.runs < 1 or not 1 <= opts.clients <= 64 or \
            not 0 <= opts.followups <= len(FOLLOWUP_QUESTIONS):
        raise Exit(f"vlfleet tune: --tokens must be >= 2, --runs >= 1, --clients 1-64 and --followups "
                   f"0-{len(FOLLOWUP_QUESTIONS)}")
    with _open_fleet(inventory, limit, ready_timeout=ready_timeout) as fleet:
        print(status_table(status(fleet)))
        print(f"\ntune {', '.join(h.name for h in fleet.hosts)}: each host leaves nginx and restarts once per engine")
        if not yes and sys.stdin.isatty() and input("Go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
            raise Exit("Aborting.")
        results = tuning.tune(fleet, opts, echo=lambda line: print(line, flush=True))
    print("\n" + tuning.table(results))
    if not all(r.ok for r in results):
        raise Exit("vlfleet tune: not every host was tuned; see the table above", code=1)


@task(help={"host": "a vlm host of the inventory", "inventory": COMMON_HELP["inventory"],
            "follow": "keep printing new lines until Ctrl-C", "lines": "how many past lines (default 100)"})
def logs(c, host, inventory="inventory.yml", follow=False, lines=100):
    """The service's journal on one host (journalctl -u vlfleet)."""
    import shlex

    from ops.fleet.batches import describe_error

    with _open_fleet(inventory, host) as fleet:
        h = fleet.host(host)
        cmd = (f"sudo -n journalctl -u {shlex.quote(h.unit)}.service -n {int(lines)} --no-pager -o short-iso"
               + (" -f" if follow else ""))
        try:
            fleet.conns[host].run(cmd, pty=bool(follow), in_stream=False if not follow else None)
        except KeyboardInterrupt:
            pass
        except Exception as e:
            raise Exit(f"vlfleet logs {host}: {describe_error(e)[1]}") from e

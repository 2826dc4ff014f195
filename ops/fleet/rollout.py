"""Rollout of a release, rollback and rolling restart across the fleet. One host's change, in order:

  stage the release beside the running one (venv, env file, model)  -- nothing serving changes yet
  drain it in nginx on every lb host (marked `down`, reload)          -- no new requests reach it
  wait until its in-flight requests finish (bounded by --drain-timeout)
  switch `current`, restart the unit, wait for /readyz naming the release and a real smoke answer
  put it back in nginx; on a failed gate: switch back to the previous release, gate again, put it back

Batching, parallelism and the --max-fail stop are ops/fleet/batches.py's; staging, ops/fleet/release.py's.
"""

from __future__ import annotations

from ops.fleet.batches import BatchRun, HostResult, Outcome, describe_error, run_batches
from ops.fleet.host_program import StepError
from ops.fleet.release import Release, stage_release
from ops.fleet.transport import Fleet, journal_hint


def rollout(fleet: Fleet, release: Release, *, batch: str = "1,25%,50%", max_fail: str | int = 0,
            parallel: int = 4, keep: int = 3) -> BatchRun:
    def step(name: str) -> HostResult:
        try:
            info = fleet.describe(name)
            if not info.get("current"):
                raise StepError("no current release on the host: converge it with `vlfleet site` first")
            before = info["current"]
            if before == release.id and fleet.status(name).get("readyz_status") == 200:
                return HostResult(name, Outcome.UNCHANGED, release=before, before=before,
                                  message="already on it and ready")
            staged = stage_release(fleet, name, release, info)
        except Exception as e:  # nothing serving was touched yet: say so
            outcome, message = describe_error(e)
            return HostResult(name, outcome, message=f"{message} (before any change; still serving)")
        result = swap_in(fleet, name, release.id, before if before != release.id else None)
        result.message = f"{staged}; {result.message}"
        if result.outcome is Outcome.OK:
            try:
                pruned = fleet.step(name, "prune", {"root": fleet.host(name).root, "keep": keep})
                if pruned["removed"]:
                    result.message += f"; pruned {', '.join(pruned['removed'])}"
            except Exception as e:  # pruning is housekeeping; the host is fine
                result.message += f"; prune failed: {e}"
        return result

    return run_batches("rollout", release.id, [h.name for h in fleet.hosts], step, batch=batch,
                       max_fail=max_fail, parallel=parallel, echo=fleet.echo)


def rollback(fleet: Fleet, to: str | None = None, *, batch: str = "1,25%,50%", max_fail: str | int = 0,
             parallel: int = 4) -> BatchRun:
    def step(name: str) -> HostResult:
        try:
            info = fleet.describe(name)
            target = to or info.get("previous")
            if not target:
                raise StepError("no previous release recorded on the host: pass --to RELEASE")
            have = {r["id"] for r in info["releases"] if r["complete"]}
            if target not in have:
                raise StepError(f"release {target} is not on the host (it has {', '.join(sorted(have)) or 'none'})")
        except Exception as e:
            outcome, message = describe_error(e)
            return HostResult(name, outcome, message=f"{message} (nothing changed)")
        if info["current"] == target:
            return HostResult(name, Outcome.UNCHANGED, release=target, before=target, message="already on it")
        return swap_in(fleet, name, target, info["current"])

    return run_batches("rollback", to or "previous release", [h.name for h in fleet.hosts], step, batch=batch,
                       max_fail=max_fail, parallel=parallel, echo=fleet.echo)


def restart(fleet: Fleet, *, batch: str = "1", max_fail: str | int = 0, parallel: int = 4) -> BatchRun:
    return run_batches("restart", "current release", [h.name for h in fleet.hosts],
                       lambda name: swap_in(fleet, name, None, None), batch=batch, max_fail=max_fail,
                       parallel=parallel, echo=fleet.echo)


def swap_in(fleet: Fleet, name: str, release: str | None, before: str | None) -> HostResult:
    """Drain, wait for in-flight requests, activate ``release`` (None: restart), gate, undrain; on a failed gate go
    back to ``before`` (when given). Exceptions leave the host drained and become its result."""
    drain = fleet.timeouts.drain
    drained = False
    try:
        fleet.set_drained([name], [])
        drained = True
        q = fleet.step(name, "quiesce", {"root": fleet.host(name).root, "timeout": drain}, timeout=drain + 60)
        note = f"drained ({q['waited_s']:.0f}s" + (f", {q['left']} request(s) cut off)" if q["left"] else ")")
        res = fleet.restart_step(name, "activate", {"release": release})
        if res["ok"]:
            fleet.set_drained([], [name])
            smoke = res.get("smoke") or {}
            return HostResult(name, Outcome.OK, release=res["release"], before=before or res.get("from"),
                              message=f"{note}; ready in {res['ready_s']:.0f}s; smoke {smoke.get('tokens')} "
                                      f"tokens in {smoke.get('seconds')}s")
        why = res["reason"] + journal_hint(res.get("journal"))
        if not before:  # a restart has nothing to go back to
            return HostResult(name, Outcome.FAILED, release=res.get("release"), before=before,
                              message=f"{why}; left out of nginx")
        back = fleet.restart_step(name, "activate", {"release": before})
        if back["ok"]:
            fleet.set_drained([], [name])
            return HostResult(name, Outcome.ROLLED_BACK, release=back["release"], before=before,
                              message=f"{why}; back on {before}")
        return HostResult(name, Outcome.FAILED, release=back.get("release"), before=before,
                          message=f"{why}; rollback to {before} failed too: {back['reason']}; left out of nginx")
    except Exception as e:  # reported per host
        outcome, message = describe_error(e)
        if drained:
            message += "; left out of nginx (drained) until someone looks"
        return HostResult(name, outcome, before=before, message=message)

"""`vlfleet tune`: a measured choice of engine per host.

Engines differ per CPU, so each host measures its own. For every engine the host can run, tune starts the service on
it (the override env file the unit reads after the release's, service.runtime.contract.ENGINE_ENV_FILE), waits for
/readyz, times ``runs`` answers of ``tokens`` tokens, each about a new image, from the host itself (the host
program's `latency` probe) and reads the service's peak RSS. The score is the median time to the complete answer
(first token + the rest of the tokens). The fastest engine whose peak fits the host's memory budget wins, unless one
is pinned (`--engine`, or `vlfleet_engine` in the host's inventory vars); the service is restarted on it and the
record is written on the host (service.runtime.contract.TUNED_FILE) and on the controller (tune-<host>.json). The
host is out of nginx meanwhile.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.fleet.batches import describe_error, format_table
from ops.fleet.inventory import FleetError
from ops.fleet.transport import Fleet, journal_hint
from ops.host.layout import service_address
from ops.machine import isa
from ops.paths import cache_root
from service.runtime.contract import ENGINE_ENV_FILE, ENGINES, TUNED_FILE
from service.runtime.settings import FIELDS

RECORD_VERSION = 1
MiB = 1024 * 1024
OK, OVER_BUDGET, FAILED = "ok", "over budget", "failed"


@dataclass
class Options:
    engines: tuple[str, ...] | None = None  # None: every engine, batching skipped (it needs concurrency to pay)
    engine: str | None = None  # pinned for every host (else a host's `vlfleet_engine` var, if any)
    tokens: int = 128
    runs: int = 3
    clients: int = 1  # answers asked at once in each run: the traffic the host should be chosen for
    followups: int = 0  # follow-up questions after each first one, in its conversation (the probe's FOLLOWUP_QUESTIONS)
    probe_timeout: float = 300.0  # one answer
    parallel: int = 4
    out: Path | None = None  # directory for tune-<host>.json (default: $VLFLEET_CACHE/reports)


@dataclass
class Candidate:
    """One engine measured on one host."""

    engine: str
    status: str  # OK, OVER_BUDGET or FAILED
    score_s: float | None = None  # median time to the complete answer
    first_token_s: float | None = None  # medians over the runs
    ms_per_token: float | None = None
    followup_first_token_s: float | None = None  # the median of the follow-ups' (with Options.followups)
    peak_rss_bytes: int | None = None
    ready_s: float | None = None
    totals_s: list[float] = field(default_factory=list)  # each run's time to the complete answer
    reason: str = ""


@dataclass
class HostTune:
    """One host's outcome: the engine it runs now (None when tune failed), why, and what was measured."""

    host: str
    ok: bool
    engine: str | None
    message: str
    candidates: list[Candidate] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    record: dict | None = None
    stranded: bool = False  # could not be put back: left out of nginx


# -- the choices (pure) -----------------------------------------------------------------------------------------

def parse_engines(spec: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``--engines serial,direct`` -> ("serial", "direct"); None or empty -> None (the default set)."""
    names = [e.strip() for e in (spec.split(",") if isinstance(spec, str) else spec or []) if e.strip()]
    unknown = [e for e in names if e not in ENGINES]
    if unknown:
        raise FleetError(f"unknown engine {', '.join(unknown)}: use {', '.join(ENGINES)}")
    return tuple(dict.fromkeys(names)) or None


# The engines that run the host's llama.cpp wheel and GGUF artifact (hybrid beside the IR's vision).
LLAMACPP_RUNTIME = ("llamacpp", "hybrid")


def plan(engines: Sequence[str] | None, pin: str | None, info: dict, clients: int = 1) -> list[tuple[str, str | None]]:
    """(engine, reason to skip it or None) in the order they are measured. A pin is the only candidate; without
    ``engines`` every engine is one, batching skipped for one client at a time; llamacpp and hybrid only where the
    host has a llama-server and a GGUF artifact."""
    explicit = pin is not None or engines is not None
    out: list[tuple[str, str | None]] = []
    for engine in [pin] if pin else engines or ENGINES:
        skip = None
        if engine == "batching" and not explicit and clients <= 1:
            skip = ("shares decode steps between concurrent requests; one answer at a time (what tune measures "
                    "without --clients) only pays its overhead: give --clients N, or name it in --engines")
        elif engine in LLAMACPP_RUNTIME:
            skip = _llamacpp_missing(info.get("llama_server") or {})
        out.append((engine, skip))
    return out


def _llamacpp_missing(server: dict) -> str | None:
    """Why the llamacpp engine cannot run on the host (host program's llama_server()), or None."""
    ship = "ship both with `vlfleet site --gguf DIR`"
    if not server.get("path"):
        return f"no llama-server on the host (none in the release's venv, no VLFLEET_LLAMACPP_SERVER): {ship}"
    if not server.get("exists"):
        return f"{server['path']} is not an executable file on the host"
    if not server.get("model_exists"):
        return (f"no GGUF artifact on the host (VLFLEET_LLAMACPP_MODEL_DIR={server.get('model_dir') or 'unset'}): "
                f"{ship}")
    return None


def budget(info: dict) -> tuple[int | None, str]:
    """The most memory the service may peak at on this host, and where that figure comes from: the memory guard's
    high-water share of its limit (VLFLEET_MEMORY_LIMIT_MB, else the unit's MemoryHigh), above which the service
    refuses new requests; else the unit's MemoryMax (the OOM kill); else none."""
    env = info.get("env") or {}
    default_high = next(f.default for f in FIELDS if f.name == "memory_high_water")
    try:
        high = float(env.get("VLFLEET_MEMORY_HIGH_WATER") or default_high)
        limit_mb = int(env.get("VLFLEET_MEMORY_LIMIT_MB") or 0)
    except ValueError:  # the service itself refuses such an env; judge by the defaults here
        high, limit_mb = default_high, 0
    if limit_mb > 0:
        return int(limit_mb * MiB * high), f"{high:.0%} of VLFLEET_MEMORY_LIMIT_MB={limit_mb} (load shedding above)"
    if info.get("memory_high"):
        return (int(info["memory_high"] * high),
                f"{high:.0%} of the unit's MemoryHigh {info['memory_high'] // MiB} MiB (load shedding above)")
    if info.get("memory_max"):
        return int(info["memory_max"]), f"the unit's MemoryMax {info['memory_max'] // MiB} MiB (OOM kill above)"
    return None, "none (no VLFLEET_MEMORY_LIMIT_MB, MemoryHigh or MemoryMax)"


def score(runs: Sequence[dict], tokens: int) -> tuple[float | None, str]:
    """The median time to a complete answer of ``tokens`` tokens over ``runs`` (the latency probe's rows: first
    questions and follow-ups alike, as the users asked them); None and the reason when any run did not give one (an
    engine that fails some answers is not a candidate)."""
    if not runs:
        return None, "no answer was timed"
    bad = [r for r in runs if r.get("error") or r.get("tokens") != tokens or r.get("total_s") is None]
    if bad:
        why = bad[0].get("error") or f"{bad[0].get('tokens')} tokens instead of {tokens}"
        return None, f"{len(bad)} of {len(runs)} answers incomplete: {str(why)[:300]}"
    return round(statistics.median(r["total_s"] for r in runs), 4), ""


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def evaluate(engine: str, runs: Sequence[dict], tokens: int, peak_rss: int | None, limit: int | None,
             ready_s: float | None = None) -> Candidate:
    """One engine's measurements -> its candidate: scored, over the budget, or failed."""
    value, why = score(runs, tokens)
    firsts = [r for r in runs if not r.get("turn")]  # rows without a turn: a probe from before follow-ups
    c = Candidate(engine, OK, value, _median(r.get("first_token_s") for r in firsts),
                  _median(r.get("ms_per_token") for r in runs),
                  _median(r.get("first_token_s") for r in runs if r.get("turn")), peak_rss, ready_s,
                  [r["total_s"] for r in runs if r.get("total_s") is not None])
    if value is None:
        c.status, c.reason = FAILED, why
    elif limit is not None and peak_rss is not None and peak_rss > limit:
        c.status, c.reason = OVER_BUDGET, f"peak RSS {peak_rss // MiB} MiB is over the budget of {limit // MiB} MiB"
    return c


def pick(candidates: Sequence[Candidate], pin: str | None = None) -> tuple[str | None, str]:
    """The engine to run and why: a pin that answered (even over budget: the operator chose it), else the lowest
    score within budget (the first listed on a tie); None and why when nothing qualifies."""
    if pin:
        c = next((c for c in candidates if c.engine == pin), None)
        if c is None or c.status == FAILED:
            return None, f"pinned engine {pin} failed: {c.reason if c else 'not measured'}"
        note = f"; {c.reason}" if c.status == OVER_BUDGET else ""
        return pin, f"pinned ({c.score_s} s to the whole answer{note})"
    within = [c for c in candidates if c.status == OK]
    if not within:
        return None, "no engine answered within budget: " + "; ".join(f"{c.engine}: {c.reason}" for c in candidates)
    best = min(within, key=lambda c: c.score_s)
    others = ", ".join(f"{c.engine} {c.score_s} s" for c in within if c is not best)
    return best.engine, f"fastest within budget: {best.score_s} s to the whole answer" + (
        f" (vs {others})" if others else "")


def record(result: HostTune, pinned: bool, opts: Options, limit: tuple[int | None, str], cpu: dict, info: dict,
           seconds: float, now: dt.datetime | None = None) -> dict:
    """The JSON record of one host's tune, as written on the host and on the controller."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return {
        "version": RECORD_VERSION, "host": result.host, "engine": result.engine, "why": result.message,
        "pinned": pinned, "tokens": opts.tokens, "runs": opts.runs, "clients": opts.clients,
        "followups": opts.followups,
        "candidates": {c.engine: {k: v for k, v in asdict(c).items() if k != "engine"} for c in result.candidates},
        "skipped": dict(result.skipped),
        "budget_bytes": limit[0], "budget": limit[1],
        "cpu": {"model": cpu.get("model") or None, "isa": isa(cpu.get("flags", "")), "flags": cpu.get("flags", "")},
        "release": info.get("release"), "time": now.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
    }


def describe_candidate(c: Candidate, opts: Options) -> str:
    if c.status == FAILED:
        return f"{c.engine}: failed: {c.reason}"
    rss = f"{c.peak_rss_bytes // MiB} MiB" if c.peak_rss_bytes is not None else "unknown"
    asked = f"{opts.runs} x {opts.clients} at once x" if opts.clients > 1 else f"{opts.runs} x"
    turns = f" + {opts.followups} follow-up(s) each" if opts.followups else ""
    followup = f", follow-ups' first token {c.followup_first_token_s} s" if opts.followups else ""
    line = (f"{c.engine}: ready in {c.ready_s} s; {asked} {opts.tokens} tokens{turns}: {c.score_s} s to the whole "
            f"answer (first token {c.first_token_s} s{followup}, {c.ms_per_token} ms/token), peak RSS {rss}")
    return line + (f"; {c.reason}" if c.status == OVER_BUDGET else "")


# -- one host ---------------------------------------------------------------------------------------------------

def _set_engine(fleet: Fleet, name: str, engine: str | None) -> dict:
    """Restart the host's service on ``engine`` (None: remove tune's override) and wait until it is ready."""
    return fleet.restart_step(name, "set_engine", {"override": ENGINE_ENV_FILE, "engine": engine})


def _measure(fleet: Fleet, name: str, opts: Options, engine: str, env: dict, limit: int | None) -> Candidate:
    started = _set_engine(fleet, name, engine)
    if not started["ok"]:
        return Candidate(engine, FAILED, reason=started["reason"] + journal_hint(started.get("journal")))
    addr, port = service_address(env)
    n = opts.clients
    turns = 1 + opts.followups
    # one answer may wait for the n - 1 asked with it: each gets n times the bound of a lone one; the keys file is
    # read on the host: keys never leave it; "" is the probe's default image
    runs = fleet.latency(name, addr, port, opts.tokens, opts.runs, opts.probe_timeout * n,
                         env.get("VLFLEET_API_KEYS_FILE", ""), n, "", opts.followups,
                         timeout=opts.probe_timeout * n * turns * opts.runs + 60)
    mem = fleet.service_step(name, "peak", {})
    return evaluate(engine, runs, opts.tokens, mem.get("peak_rss_bytes"), limit, started.get("ready_s"))


def _controller_copy(rec: dict, out: Path | None) -> Path:
    folder = out or cache_root() / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tune-{rec['host']}.json"
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def tune_host(fleet: Fleet, name: str, opts: Options, echo: Callable[[str], None] = print) -> HostTune:
    """Measure, choose, run on the choice, record; a failure is this host's result, never an exception."""
    started = time.monotonic()
    host = fleet.host(name)
    pin = opts.engine or host.var("vlfleet_engine") or None
    try:
        if pin:
            parse_engines([pin])  # a host var with a typo fails this host, before anything changes
        info = fleet.service_step(name, "tune_info", {"override": ENGINE_ENV_FILE, "record": TUNED_FILE})
        cpu = fleet.probe(name, "facts", host.root)
        steps = plan(opts.engines, pin, info, opts.clients)
    except Exception as e:  # reported per host
        return HostTune(name, False, None, describe_error(e)[1])
    limit = budget(info)
    echo(f"[tune] {name}: {cpu.get('model') or 'CPU ?'}; budget {limit[1]}; "
         + ("pinned " + pin if pin else "candidates " + ", ".join(e for e, skip in steps if not skip)))
    drained = False
    try:
        fleet.set_drained([name], [])
        drained = True
        fleet.service_step(name, "quiesce", {"timeout": fleet.timeouts.drain}, timeout=fleet.timeouts.drain + 60)
        result = _choose_and_run(fleet, name, opts, steps, pin, info, limit[0], echo)
        if result.ok:
            result.record = record(result, bool(pin), opts, limit, cpu, info, time.monotonic() - started)
            fleet.service_step(name, "write_record", {"path": TUNED_FILE, "record": result.record})
            path = _controller_copy(result.record, opts.out)
            echo(f"[tune] {name}: runs {result.engine}: {result.message}; record: {TUNED_FILE}, {path}")
        if not result.stranded:
            fleet.set_drained([], [name])
            drained = False
        return result
    except Exception as e:  # reported per host
        why = describe_error(e)[1] + ("; left out of nginx (drained) until someone looks" if drained else "")
        return HostTune(name, False, None, why, stranded=drained)


def _choose_and_run(fleet: Fleet, name: str, opts: Options, steps: list[tuple[str, str | None]], pin: str | None,
                    info: dict, limit: int | None, echo: Callable[[str], None]) -> HostTune:
    """Measure every candidate, then run the service on the choice; on no choice, put back the engine it ran."""
    result = HostTune(name, False, None, "")
    running = None
    for engine, skip in steps:
        if skip:
            result.skipped[engine] = skip
            echo(f"[tune] {name}: {engine}: skipped: {skip}")
            continue
        c = _measure(fleet, name, opts, engine, info["env"], limit)
        running = engine if c.ready_s is not None else None  # it started (whatever its answers were)
        result.candidates.append(c)
        echo(f"[tune] {name}: {describe_candidate(c, opts)}")
    choice, why = pick(result.candidates, pin)
    if choice is not None and choice != running:
        started = _set_engine(fleet, name, choice)
        if not started["ok"]:
            choice, why = None, f"{choice} did not start again: {started['reason']}"
    if choice is not None:
        result.ok, result.engine, result.message = True, choice, why
        return result
    back = _set_engine(fleet, name, (info.get("override") or {}).get("VLFLEET_ENGINE"))
    if back["ok"]:
        result.message = f"{why}; back on {back['engine']} as before"
    else:
        result.message = f"{why}; putting it back failed too: {back['reason']}; left out of nginx"
        result.stranded = True
    return result


# -- the fleet --------------------------------------------------------------------------------------------------

def tune(fleet: Fleet, opts: Options, echo: Callable[[str], None] = print) -> list[HostTune]:
    """Every host of the fleet, at most ``opts.parallel`` at once; one host's failure does not stop the others."""
    with ThreadPoolExecutor(max_workers=max(1, opts.parallel)) as pool:  # it starts no more threads than hosts
        return list(pool.map(lambda h: tune_host(fleet, h.name, opts, echo), fleet.hosts))


def table(results: Sequence[HostTune]) -> str:
    rows = [("host", "engine", "result", "scores (s to the whole answer)", "details")]
    for r in results:
        scores = ", ".join(f"{c.engine} {c.score_s if c.score_s is not None else c.status}"
                           for c in r.candidates) or "-"
        rows.append((r.host, r.engine or "-", "ok" if r.ok else "failed", scores, r.message))
    return format_table(rows)

"""Batching and abort logic of a rolling change (rollout, rollback, restart), independent of how a host is changed.

Hosts are cut into batches in inventory order by a batch spec: "1,25%,50%" makes a canary batch of one host, then
batches of 25% and 50% of the fleet (rounded down, at least one host); the last size repeats until every host is
placed. Hosts of a batch run in parallel on a bounded pool; a batch always finishes. When the hosts that failed so
far exceed --max-fail (a count, or a percentage of the fleet), no further batch starts and the remaining hosts are
left untouched. Whatever a step raises becomes that host's result: never a traceback.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

from ops.fleet.host_program import StepError


class RolloutError(ValueError):
    """A bad --batch or --max-fail value; the message says what is accepted."""


class Outcome(str, Enum):
    OK = "ok"  # the host runs the target and passed its gate
    UNCHANGED = "unchanged"  # it already ran the target and was ready: nothing done
    ROLLED_BACK = "rolled back"  # failed its gate, back on its previous release and in rotation
    FAILED = "failed"  # failed, and could not be put back: left out of the load balancer
    UNREACHABLE = "unreachable"  # SSH could not connect, or the connection died
    SKIPPED = "skipped"  # never touched: the rollout stopped before its batch


@dataclass
class HostResult:
    host: str
    outcome: Outcome
    release: str | None = None  # what the host runs at the end ("" when unknown)
    before: str | None = None  # what it ran before
    message: str = ""
    seconds: float = 0.0
    batch: int = 0


@dataclass
class BatchRun:
    action: str
    target: str
    results: list[HostResult] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)
    stopped: str = ""  # why no further batch started ("" when every batch ran)
    seconds: float = 0.0

    @property
    def failures(self) -> list[HostResult]:
        return [r for r in self.results if r.outcome in (Outcome.ROLLED_BACK, Outcome.FAILED, Outcome.UNREACHABLE)]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.stopped

    def table(self) -> str:
        rows = [("host", "batch", "result", "before", "now", "time", "details")]
        rows += [(r.host, str(r.batch) if r.batch else "-", r.outcome.value, r.before or "-", r.release or "-",
                  f"{r.seconds:.0f}s" if r.batch else "-", r.message) for r in self.results]
        return format_table(rows)

    def summary(self) -> str:
        done = sum(r.outcome in (Outcome.OK, Outcome.UNCHANGED) for r in self.results)
        head = (f"{self.action} {self.target}: {done}/{len(self.results)} hosts on it, "
                f"{len(self.failures)} failed, {self.seconds:.0f} s")
        return head + (f"; stopped: {self.stopped}" if self.stopped else "")


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _hosts(item: str, what: str, total: int) -> tuple[int, bool]:
    """A count or a percentage of ``total`` (rounded down) as a number of hosts, and whether it was a percentage."""
    item = item.strip()
    percent = item.endswith("%")
    try:
        value = float(item[:-1]) if percent else int(item)
    except ValueError:
        raise RolloutError(f"{what}: {item!r} is neither a host count (e.g. 2) nor a percentage (e.g. 25%)") from None
    if value < 0 or (percent and value > 100):
        raise RolloutError(f"{what}: {item!r} is out of range (counts >= 0, percentages 0-100%)")
    return int(total * value / 100) if percent else int(value), percent


def batch_sizes(spec: str, total: int) -> list[int]:
    """Sizes of the successive batches for ``total`` hosts (they sum to ``total``)."""
    items = [p for p in (spec or "").split(",") if p.strip()]
    if not items:
        raise RolloutError("--batch is empty: give sizes like 1,25%,50% (a canary, then a quarter, then halves)")
    sizes = []
    for item in items:
        hosts, percent = _hosts(item, "--batch", total)
        if not percent and hosts < 1:
            raise RolloutError(f"--batch: a batch of {item.strip()} hosts would never finish; use sizes >= 1")
        sizes.append(max(1, hosts))
    out: list[int] = []
    while sum(out) < total:
        out.append(min(sizes[min(len(out), len(sizes) - 1)], total - sum(out)))
    return out


def plan_batches(hosts: Sequence[str], spec: str) -> list[list[str]]:
    """The hosts cut into batches, in inventory order (so the canary is the first host)."""
    if len(set(hosts)) != len(hosts):
        raise RolloutError("a host is listed twice")
    rest = iter(hosts)
    return [list(itertools.islice(rest, size)) for size in batch_sizes(spec, len(hosts))]


def max_failures(value: str | int, total: int) -> int:
    """--max-fail as a number of hosts: "0" (stop at the first failure), "2", or "10%" (of ``total``, rounded down)."""
    return _hosts(str(value), "--max-fail", total)[0]


def describe_error(exc: BaseException) -> tuple[Outcome, str]:
    """A one-line reason for what a step raised, and whether the host counts as unreachable."""
    from invoke.exceptions import CommandTimedOut, UnexpectedExit
    from paramiko.ssh_exception import AuthenticationException, NoValidConnectionsError, SSHException

    if isinstance(exc, StepError):  # the host program's own words
        return Outcome.FAILED, str(exc)
    if isinstance(exc, CommandTimedOut):
        return Outcome.FAILED, f"command timed out after {exc.timeout} s: {exc.result.command[:80]}"
    if isinstance(exc, UnexpectedExit):
        res = exc.result
        tail = (res.stderr or res.stdout or "").strip().splitlines()[-3:]
        return Outcome.FAILED, f"remote command failed (exit {res.exited}): {' | '.join(tail)[:400]}"
    if isinstance(exc, AuthenticationException):
        return Outcome.UNREACHABLE, f"SSH authentication failed ({exc}); check the user and key in the inventory"
    if isinstance(exc, NoValidConnectionsError):
        return Outcome.UNREACHABLE, f"cannot connect: {exc.strerror or exc}"
    if isinstance(exc, TimeoutError):  # socket.timeout too
        return Outcome.UNREACHABLE, f"timed out talking to the host ({exc or 'no answer'})"
    if isinstance(exc, (SSHException, EOFError, ConnectionError)):
        return Outcome.UNREACHABLE, f"connection lost ({type(exc).__name__}: {exc or 'closed'}); host gone?"
    if isinstance(exc, OSError):
        return Outcome.UNREACHABLE, f"cannot reach the host: {exc}"
    return Outcome.FAILED, f"{type(exc).__name__}: {exc}"


def run_batches(action: str, target: str, hosts: Sequence[str], step: Callable[[str], HostResult], *,
                batch: str = "1,25%,50%", max_fail: str | int = 0, parallel: int = 4,
                echo: Callable[[str], None] | None = print) -> BatchRun:
    """Run ``step`` for every host, batch after batch, and stop when failures exceed ``max_fail``."""
    if parallel < 1:
        raise RolloutError("--parallel must be at least 1")
    batches = plan_batches(hosts, batch)
    allowed = max_failures(max_fail, len(hosts))
    report = BatchRun(action, target, batches=batches)
    started = time.monotonic()
    say = echo or (lambda _line: None)

    def guarded(host: str) -> HostResult:
        t0 = time.monotonic()
        try:
            result = step(host)
        except Exception as e:  # every failure of one host becomes its result, never a traceback
            outcome, message = describe_error(e)
            result = HostResult(host, outcome, message=message)
        result.seconds = result.seconds or round(time.monotonic() - t0, 1)
        return result

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="rollout") as pool:
        for number, members in enumerate(batches, 1):
            if report.stopped:
                report.results += [HostResult(h, Outcome.SKIPPED, message="not attempted") for h in members]
                continue
            say(f"[{action}] batch {number}/{len(batches)}{' (canary)' if number == 1 and len(batches) > 1 else ''}:"
                f" {', '.join(members)}")
            for result in pool.map(guarded, members):
                result.batch = number
                report.results.append(result)
                say(f"[{action}]   {result.host}: {result.outcome.value} {result.message}".rstrip())
            failed = len(report.failures)
            if failed > allowed and number < len(batches):
                report.stopped = (f"{failed} host(s) failed, more than --max-fail {max_fail} allows; "
                                  f"the remaining hosts were not touched")
    report.seconds = round(time.monotonic() - started, 1)
    return report

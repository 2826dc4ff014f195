"""Batching and abort logic of rolling changes (ops/fleet/batches.py), and the status table's metric parsing."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from ops.fleet.batches import (
    HostResult,
    Outcome,
    RolloutError,
    batch_sizes,
    max_failures,
    plan_batches,
    run_batches,
)
from ops.fleet.prometheus_text import histogram_quantile, info_labels


@pytest.mark.parametrize(("spec", "total", "sizes"), [
    ("1,25%,50%", 3, [1, 1, 1]),
    ("1,25%,50%", 10, [1, 2, 5, 2]),
    ("1,25%,50%", 1, [1]),
    ("2", 5, [2, 2, 1]),
    ("100%", 4, [4]),
    ("1, 50%", 7, [1, 3, 3]),
    ("10%", 3, [1, 1, 1]),  # a percentage never rounds down to an empty batch
])
def test_batch_sizes_follow_ansible_serial(spec, total, sizes):
    assert batch_sizes(spec, total) == sizes
    assert sum(sizes) == total


@pytest.mark.parametrize("spec", ["", "0", "1,abc", "150%", "-1"])
def test_bad_batch_specs_are_refused_with_the_accepted_forms(spec):
    with pytest.raises(RolloutError, match="--batch"):
        batch_sizes(spec, 3)


def test_plan_keeps_inventory_order_so_the_first_host_is_the_canary():
    assert plan_batches(["c1", "c2", "vm1", "c3"], "1,50%") == [["c1"], ["c2", "vm1"], ["c3"]]
    with pytest.raises(RolloutError, match="twice"):
        plan_batches(["c1", "c1"], "1")


@pytest.mark.parametrize(("value", "total", "allowed"), [("0", 5, 0), (2, 5, 2), ("10%", 20, 2), ("50%", 3, 1)])
def test_max_fail_as_count_or_percentage(value, total, allowed):
    assert max_failures(value, total) == allowed


def test_bad_max_fail_is_refused():
    with pytest.raises(RolloutError, match="--max-fail"):
        max_failures("some", 3)


class Recorder:
    """A step that records calls and concurrency; hosts in ``fail`` fail their gate, ``boom`` maps to exceptions."""

    def __init__(self, fail=(), boom=None, gate: threading.Barrier | None = None):
        self.fail, self.boom, self.gate = set(fail), dict(boom or {}), gate
        self.calls: list[str] = []
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()

    def __call__(self, host: str) -> HostResult:
        with self.lock:
            self.calls.append(host)
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if self.gate is not None:
                self.gate.wait()  # every step of a round meets here: they are running at the same time
            if host in self.boom:
                raise self.boom[host]
            if host in self.fail:
                return HostResult(host, Outcome.ROLLED_BACK, release="r1", before="r1", message="gate failed")
            return HostResult(host, Outcome.OK, release="r2", before="r1")
        finally:
            with self.lock:
                self.active -= 1


HOSTS = ["h1", "h2", "h3", "h4", "h5"]


def test_all_hosts_pass_every_batch_runs():
    step = Recorder()
    report = run_batches("rollout", "r2", HOSTS, step, batch="1,50%", echo=None)
    assert report.ok and not report.stopped
    assert [r.host for r in report.results] == HOSTS
    assert [r.batch for r in report.results] == [1, 2, 2, 3, 3]
    assert sorted(step.calls) == HOSTS


def test_failed_canary_stops_the_rollout_and_leaves_the_rest_untouched():
    step = Recorder(fail={"h1"})
    report = run_batches("rollout", "r2", HOSTS, step, batch="1,50%", max_fail=0, echo=None)
    assert step.calls == ["h1"]
    assert "not touched" in report.stopped and not report.ok
    assert [r.outcome for r in report.results] == [Outcome.ROLLED_BACK] + [Outcome.SKIPPED] * 4
    assert "h5" in report.table() and "skipped" in report.table()


def test_failures_within_max_fail_carry_on():
    step = Recorder(fail={"h1"})
    report = run_batches("rollout", "r2", HOSTS, step, batch="1,50%", max_fail=1, echo=None)
    assert sorted(step.calls) == HOSTS
    assert not report.stopped and not report.ok  # carried on, but the failure still shows
    assert len(report.failures) == 1


def test_a_batch_always_finishes_before_the_stop():
    step = Recorder(fail={"h2"})
    report = run_batches("rollout", "r2", HOSTS, step, batch="1,2", max_fail=0, echo=None)
    assert sorted(step.calls) == ["h1", "h2", "h3"]  # h3 shares h2's batch
    assert [r.outcome for r in report.results][3:] == [Outcome.SKIPPED, Outcome.SKIPPED]


def test_exceptions_become_per_host_results_not_tracebacks():
    refused = NoValidConnectionsError({("10.0.0.3", 22): ConnectionRefusedError(111, "Connection refused")})
    step = Recorder(boom={"h2": refused, "h3": TimeoutError("timed out"), "h4": KeyError("env")})
    report = run_batches("rollout", "r2", HOSTS[:4], step, batch="100%", max_fail=3, echo=None)
    by_host = {r.host: r for r in report.results}
    assert by_host["h2"].outcome is Outcome.UNREACHABLE and "cannot connect" in by_host["h2"].message
    assert by_host["h3"].outcome is Outcome.UNREACHABLE and "timed out" in by_host["h3"].message
    assert by_host["h4"].outcome is Outcome.FAILED and "KeyError" in by_host["h4"].message
    assert by_host["h1"].outcome is Outcome.OK


def test_parallelism_is_bounded_by_the_pool():
    # Steps wait for each other in threes: three really run at once, and a fourth one running would show in the
    # peak (a pool of 3 lets no fourth in; a wider one would, and then the barrier breaks after 10 s).
    step = Recorder(gate=threading.Barrier(3, timeout=10))
    hosts = [f"h{i}" for i in range(9)]
    report = run_batches("restart", "current", hosts, step, batch="100%", parallel=3, echo=None)
    assert step.peak == 3
    assert [r.outcome for r in report.results] == [Outcome.OK] * 9, report.table()


def test_summary_names_counts_and_the_stop_reason():
    report = run_batches("rollout", "r2", HOSTS, Recorder(fail={"h1"}), batch="1", echo=None)
    line = report.summary()
    assert line.startswith("rollout r2: 0/5 hosts on it, 1 failed") and "stopped" in line


def test_histogram_quantile_matches_prometheus_interpolation():
    from prometheus_client import CollectorRegistry, Histogram, Info, generate_latest

    reg = CollectorRegistry()
    h = Histogram("vlfleet_time_to_first_token_seconds", "ttft", buckets=(0.5, 1.0, 2.0), registry=reg)
    Info("vlfleet_model", "model", registry=reg).info({"release_id": "r2", "artifact_id": "a1"})
    text = generate_latest(reg).decode()
    assert histogram_quantile(text, "vlfleet_time_to_first_token_seconds", 0.5) is None
    for value in (0.2, 0.7, 0.8, 1.5):
        h.observe(value)
    text = generate_latest(reg).decode()
    # 4 observations, rank 2: the first of the two in (0.5, 1.0], linearly placed -> 0.75
    assert histogram_quantile(text, "vlfleet_time_to_first_token_seconds", 0.5) == pytest.approx(0.75)
    # rank 1: all of (0, 0.5] -> 0.5
    assert histogram_quantile(text, "vlfleet_time_to_first_token_seconds", 0.25) == pytest.approx(0.5)
    assert info_labels(text, "vlfleet_model") == {"release_id": "r2", "artifact_id": "a1"}


VLFLEET = str(Path(sys.executable).with_name("vlfleet"))


@pytest.mark.parametrize(("args", "message"), [
    (["rollout", "--release", "r2", "-i", "/nonexistent/inv.yml"], "inventory /nonexistent/inv.yml not found"),
    (["rollout", "--release", "bad id"], "--release: release id 'bad id'"),
    (["rollout", "--release", "r2", "--env", "PATH=/x"], "only VLFLEET_* settings"),
])
def test_operator_mistakes_get_a_message_not_a_traceback(args, message):
    done = subprocess.run([VLFLEET, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert message in done.stderr + done.stdout and "Traceback" not in done.stderr

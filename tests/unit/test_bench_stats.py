"""Order statistics and memory-status parsing used by the benchmarks."""

from __future__ import annotations

import pytest

from ops.bench.concurrency import aggregate
from ops.bench.memory import parse_status_kib
from ops.bench.stats import percentile, ratio
from ops.bench.workload import Sample, summarize


def test_percentile_matches_linear_interpolation():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 95) == pytest.approx(4.8)
    assert percentile([7.0], 95) == 7.0


def test_percentile_refuses_empty_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_ratio_is_none_without_both_numbers():
    assert ratio(1.0, 4.0) == 0.25
    assert ratio(None, 4.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def test_ms_per_token_excludes_the_first_token():
    s = Sample(first_token_s=1.0, total_s=4.15, tokens=64)
    assert s.ms_per_token == pytest.approx(50.0)


def test_summarize_takes_medians():
    out = summarize([Sample(1.0, 4.0, 61), Sample(3.0, 9.0, 61), Sample(2.0, 5.0, 61)])
    assert out["first_token_s"] == 2.0
    assert out["total_s"] == 5.0
    assert out["ms_per_token"] == pytest.approx(50.0)
    assert out["runs"] == 3


def test_concurrency_aggregate_counts_tokens_over_wall_time_and_errors():
    samples = [Sample(1.0, 5.0, 64), Sample(3.0, 8.0, 64)]
    out = aggregate(samples, ["HTTPError: 429"], wall_s=8.0, clients=3)
    assert out["tokens_per_s"] == pytest.approx(16.0)
    assert out["errors"] == 1
    assert out["requests"] == 3
    assert out["first_token_p50_s"] == pytest.approx(2.0)
    assert out["first_token_p95_s"] == pytest.approx(2.9)


def test_status_parsing_reads_kib_as_bytes():
    text = "Name:\tpython\nVmPeak:\t  999 kB\nVmHWM:\t 2048 kB\nVmRSS:\t 1024 kB\n"
    assert parse_status_kib(text, "VmHWM") == 2048 * 1024
    assert parse_status_kib(text, "VmSwap") is None


def test_tree_peak_counts_a_child_started_by_another_thread():
    """llamacpp's llama-server is started by the inference thread: it must count in the service's peak."""
    import subprocess
    import sys
    import time

    from ops.bench.memory import peak_rss_bytes, tree_peak_rss_bytes

    code = ("import subprocess, sys, threading, time\n"
            "child = []\n"
            "threading.Thread(target=lambda: child.append(subprocess.Popen([sys.executable, '-c', "
            "'b = bytearray(100 * 2**20); import time; time.sleep(20)']))).start()\n"
            "time.sleep(20)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        def children_peak() -> int:
            return tree_peak_rss_bytes(parent.pid) - peak_rss_bytes(parent.pid)

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and children_peak() < 100 * 2**20:
            time.sleep(0.2)
        assert children_peak() >= 100 * 2**20
    finally:
        import os
        import signal

        os.killpg(parent.pid, signal.SIGKILL)  # the parent and its child: the session we started
        parent.wait()

"""The fleet report's probe program, run as the report runs it on a host (`python -c PROBE ...`), against the real
service on the tiny model: it gets exactly the tokens it asked for and times them."""

from __future__ import annotations

import json
import subprocess
import sys

from ops.report import PROBE, summarize_probe


def test_probe_streams_and_times_real_requests(service):
    done = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", str(service.port), "8", "2", "120"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert len(runs) == 2
    for run in runs:
        assert run["status"] == 200 and run["error"] is None, run
        assert run["tokens"] == 8  # ignore_eos: exactly max_tokens, counted by the service's usage chunk
        assert 0 < run["first_token_s"] <= run["total_s"]
        assert run["ms_per_token"] > 0
    summary = summarize_probe(runs)
    assert summary["ok_runs"] == 2 and summary["tokens"] == 8
    assert min(r["first_token_s"] for r in runs) <= summary["first_token_s"] <= max(r["first_token_s"] for r in runs)


def test_probe_reports_a_refused_request_as_an_error(service):
    # A port where nothing listens: the error is reported per run, the program itself still succeeds.
    from tests.servers import free_port

    done = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", str(free_port()), "8", "1", "5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)
    assert run["first_token_s"] is None and "ConnectionRefusedError" in run["error"]
    assert summarize_probe([run])["error"].startswith("ConnectionRefusedError")

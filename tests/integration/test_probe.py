"""The host program's venv probes, run as the checklist and the report run them on a host (`<venv python>
vlfleet-host-*.pyz ...`, last stdout line JSON), against the real service on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

from ops.fleet import host_program
from ops.report import summarize_probe
from tests.servers import free_port

RUNS, REUSED = "vlfleet_vision_encoder_runs_total", "vlfleet_reused_prompt_tokens_total"


def run(command: str, *args: object, timeout: float = 300):
    done = subprocess.run([sys.executable, str(host_program.build().path), command, *(str(a) for a in args)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_latency_streams_and_times_real_requests(service):
    runs = run("latency", "127.0.0.1", service.port, 8, 2, 120)
    assert len(runs) == 2
    for r in runs:
        assert r["status"] == 200 and r["error"] is None, r
        assert r["tokens"] == 8  # ignore_eos: exactly max_tokens, counted by the service's usage chunk
        assert 0 < r["first_token_s"] <= r["total_s"]
        assert r["ms_per_token"] > 0
    summary = summarize_probe(runs)
    assert summary["ok_runs"] == 2 and summary["tokens"] == 8
    assert min(r["first_token_s"] for r in runs) <= summary["first_token_s"] <= max(r["first_token_s"] for r in runs)


def test_latency_with_clients_asks_that_many_at_once(service):
    runs = run("latency", "127.0.0.1", service.port, 8, 2, 120, "", 3)
    assert len(runs) == 6 and all(r["status"] == 200 and r["tokens"] == 8 for r in runs), runs
    # The tiny service answers one request at a time: asked together, each run's last first token comes after its
    # first answer ended; asked one after another, every first token would come before any answer ended.
    for batch in (runs[:3], runs[3:]):
        assert max(r["first_token_s"] for r in batch) >= min(r["total_s"] for r in batch), batch


def test_latency_with_followups_continues_each_conversation(service):
    # Two conversations at once, each a first question and a follow-up that re-sends it (image and answer): the
    # direct engine encodes each picture once (a size no other test asks about: its encoded pictures are kept).
    runs_before = service.metric(RUNS)
    runs = run("latency", "127.0.0.1", service.port, 8, 1, 120, "", 2, "40x36", 1)
    assert [r["turn"] for r in runs] == [0, 1, 0, 1], runs
    assert all(r["status"] == 200 and r["tokens"] == 8 and r["cache"] == "miss" for r in runs), runs
    assert service.metric(RUNS) - runs_before == 2
    # Alone, a follow-up finds its conversation's KV: the first turn's prompt and its answer as generated (all but
    # the last token, which was never fed back) are reused.
    reused_before = service.metric(REUSED)
    first, followup = run("latency", "127.0.0.1", service.port, 8, 1, 120, "", 1, "40x36", 1)
    assert (first["cache"], followup["cache"]) == ("miss", "miss")
    assert followup["turn"] == 1 and followup["prompt_tokens"] > first["prompt_tokens"] + 8, (first, followup)
    assert service.metric(REUSED) - reused_before >= first["prompt_tokens"] + 8 - 1


def test_latency_refuses_a_bad_pictures_size():
    # The size is the eighth argument: a bad one is a usage error of the program (the controller checks it first).
    args = ["latency", "127.0.0.1", free_port(), 8, 1, 5, "", 1, "64"]
    bad = subprocess.run([sys.executable, str(host_program.build().path), *map(str, args)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "usage: latency" in bad.stdout, bad


def test_latency_with_small_pictures_streams_real_requests(service):
    (r,) = run("latency", "127.0.0.1", service.port, 4, 1, 120, "", 1, "32x32")
    assert r["status"] == 200 and r["tokens"] == 4, r


def test_latency_reports_a_refused_request_as_an_error():
    # A port where nothing listens: the error is reported per run, the program itself still succeeds.
    (r,) = run("latency", "127.0.0.1", free_port(), 8, 1, 5, timeout=60)
    assert r["first_token_s"] is None and "ConnectionRefusedError" in r["error"]
    assert summarize_probe([r])["error"].startswith("ConnectionRefusedError")


def test_stream_gets_content_and_done(service):
    out = run("stream", "127.0.0.1", service.port, "qwen3-vl-2b-instruct", 60, 120)
    assert out["status"] == 200 and out["error"] is None, out
    assert out["chunks"] > 0 and out["done"] and 0 < out["first_token_s"] <= out["total_s"]


def test_stream_sends_the_first_key_of_the_keys_file(service, tmp_path):
    # The service here needs no key: a keys file that cannot be read proves the probe reads it.
    out = run("stream", "127.0.0.1", service.port, "m", 60, 120, tmp_path / "missing-keys")
    assert out["status"] is None and out["error"].startswith("FileNotFoundError")


def test_readyz_answers_the_body(service):
    out = run("readyz", f"{service.url}/readyz")
    assert out["status"] == 200 and out["error"] is None and out["body"]["ready"] is True, out


def test_readyz_of_nothing_is_an_error():
    out = run("readyz", f"http://127.0.0.1:{free_port()}/readyz", timeout=60)
    assert out["status"] is None and "URLError" in out["error"]


def test_runtime_versions_of_this_venv():
    out = run("runtime-versions")
    assert out["python"] == ".".join(map(str, sys.version_info[:3]))
    assert set(out["dists"]) == {"openvino", "openvino-genai", "openvino-tokenizers"}
    assert all(row["version"] and row["import"] == "ok" for row in out["dists"].values()), out

"""The bench's llama-server peer without llama.cpp: its command line, its GGUF artifact's files, the timings in its
stream, and the start/measure/stop cycle against a stand-in server that speaks the same protocol."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ops.bench import llama_server, workload
from ops.bench.suite import PeerInputs, Plan, measure_peer
from ops.host import client
from ops.llamacpp.gguf import GgufParams, gguf_manifest
from service.runtime import manifest as mf

# A stand-in llama-server: /health, and a streamed chat completion shaped like llama-server's (content deltas, the
# last one with finish_reason and timings, then a usage chunk with no choices). It records each request's body.
FAKE_SERVER = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
bodies = sys.argv[0] + ".bodies"

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(bodies, "a") as f:
            f.write(json.dumps(body) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        for i in range(n):
            last = i == n - 1
            chunk = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "length" if last else None}]}
            if last:
                chunk["timings"] = {"prompt_n": 120, "prompt_ms": 900.5, "predicted_n": n,
                                    "predicted_per_token_ms": 20.0, "note": "text is dropped"}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(0.002)
        usage = {"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")

ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def gguf_artifact(directory: Path) -> Path:
    directory.mkdir()
    params = GgufParams("Q4_0", "q8_0")
    (directory / params.lm_file).write_bytes(b"GGUF" + bytes(64))
    (directory / params.mmproj_file).write_bytes(b"GGUF" + bytes(32))
    manifest = gguf_manifest(directory, origin={"kind": "dir", "uri": "/c", "revision": "sha256:0"}, params=params,
                             tools={"llama-cpp-python": "0.3.36"}, pre_tokenizer=None)
    mf.write_manifest(directory, manifest)
    return directory


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    script.chmod(0o755)
    return script


def test_command_line_is_loopback_one_slot_with_the_services_threads(tmp_path):
    files = llama_server.artifact_files(gguf_artifact(tmp_path / "art"))
    assert files.language_model.name == "language-model-Q4_0.gguf" and files.mmproj.name == "mmproj-q8_0.gguf"
    cmd = llama_server.server_command(Path("/b/llama-server"), files, 8123, 2)
    assert cmd[:5] == ["/b/llama-server", "-m", str(files.language_model), "--mmproj", str(files.mmproj)]
    pairs = dict(zip(cmd[5::2], cmd[6::2], strict=False))
    assert pairs["-t"] == pairs["-tb"] == "2" and pairs["-np"] == "1" and pairs["-c"] == "4096"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert cmd[-1] == "--no-webui"
    assert llama_server.threads() == len(os.sched_getaffinity(0))


def test_an_ir_artifact_is_not_taken_for_a_gguf_one(tmp_path):
    art = tmp_path / "ir"
    art.mkdir()
    (art / "openvino_model.xml").write_text("<net/>")
    mf.write_manifest(art, mf.build_manifest(art, source={}, weight_format={"weight_format": "int4"}, tools={},
                                             min_runtime="2026.4"))
    with pytest.raises(ValueError, match="is not a GGUF artifact"):
        llama_server.artifact_files(art)


def test_server_timings_keep_numbers_only():
    assert client.server_timings({"timings": {"prompt_ms": 12.5, "prompt_n": 7, "cache": True, "s": "x"}}) == {
        "prompt_ms": 12.5, "prompt_n": 7}
    assert client.server_timings({"choices": []}) == {}
    assert client.server_timings({"timings": None}) == {}


def test_timing_medians_need_every_answer_to_report_the_key():
    def answer(**timings) -> workload.Answer:
        return workload.Answer(workload.Sample(1.0, 2.0, 8), "", {}, 10, timings)

    medians = llama_server.timing_medians([answer(prompt_ms=10.0, predicted_n=8), answer(prompt_ms=30.0),
                                           answer(prompt_ms=20.0)])
    assert medians == {"prompt_ms": 20.0}


def test_llama_server_is_measured_with_the_bench_client_and_stopped(tmp_path, fake_binary):
    art = gguf_artifact(tmp_path / "art")
    plan = Plan(runs=2, tokens=6, log_dir=tmp_path / "logs")
    said: list[str] = []
    entry = measure_peer(PeerInputs(fake_binary, art, {"version": "0.3.36", "flags": ["-DGGML_NATIVE=ON"]}), plan,
                         said.append)
    summ = entry["image_416"]
    assert summ["runs"] == 2 and summ["tokens"] == 6 and summ["prompt_tokens"] == 120
    assert summ["server_timings"] == {"prompt_n": 120, "prompt_ms": 900.5, "predicted_n": 6,
                                      "predicted_per_token_ms": 20.0}
    assert entry["threads"] == len(os.sched_getaffinity(0)) and entry["cold_start_s"] > 0
    assert entry["peak_rss_bytes"] > 0 and entry["command"][0] == "llama-server"
    assert entry["artifact"]["artifact_id"] == mf.read_manifest(art)["artifact_id"]
    assert entry["build"]["version"] == "0.3.36" and isinstance(entry["machine"]["isa"], list)
    bodies = [json.loads(line) for line in Path(f"{fake_binary}.bodies").read_text().splitlines()]
    assert [b["max_tokens"] for b in bodies] == [8, 6, 6]  # the warm-up, then the runs
    for body in bodies:  # the service's request plus what makes llama-server do the same work
        png = body["messages"][0]["content"][0]["image_url"]["url"]
        assert set(body) == {"messages", "max_tokens", "ignore_eos", "stream", "stream_options", "cache_prompt",
                             "temperature"}
        assert {k: body[k] for k in ("ignore_eos", "stream", "cache_prompt", "temperature")} == {
            "ignore_eos": True, "stream": True, "cache_prompt": False, "temperature": 0}
        assert png.startswith("data:image/png;base64,")
    assert bodies[1]["messages"] == [workload.user_turn(workload.test_image(416, 277, seed=0))]
    assert bodies[2]["messages"] == [workload.user_turn(workload.test_image(416, 277, seed=1))]
    assert any("llama-server run 2/2" in m for m in said)


def test_the_server_is_stopped_by_pid_when_the_body_raises(tmp_path, fake_binary):
    art = gguf_artifact(tmp_path / "art")
    with pytest.raises(KeyboardInterrupt), llama_server.LlamaServer(fake_binary, art, tmp_path / "s.log") as s:
        pid = s.proc.pid
        raise KeyboardInterrupt
    assert s.proc.returncode is not None
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    art = gguf_artifact(tmp_path / "art")
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error: unknown argument: --no-webui' >&2\nexit 1\n")
    broken.chmod(0o755)
    server = llama_server.LlamaServer(broken, art, tmp_path / "s.log", ready_timeout=30)
    with pytest.raises(RuntimeError, match=r"(?s)died while loading \(exit code 1\).*unknown argument"):
        server.__enter__()


def test_the_smoke_loads_and_answers_one_token(tmp_path, fake_binary):
    art = gguf_artifact(tmp_path / "art")
    result = llama_server.smoke(fake_binary, art, tmp_path / "smoke.log")
    assert result["ok"] and result["prompt_tokens"] == 120 and result["load_s"] > 0 and result["first_token_s"] > 0
    (body,) = [json.loads(line) for line in Path(f"{fake_binary}.bodies").read_text().splitlines()]
    assert body["max_tokens"] == 1 and body["cache_prompt"] is False
    log = tmp_path / "verbose.log"
    log.write_text("0.00.008 I load_backend: loaded CPU backend from /b/bin/libggml-cpu-zen4.so\n"
                   "load_tensors:   CPU_Mapped model buffer size =   993.15 MiB\n"
                   "load_tensors:   CPU_REPACK model buffer size =   756.00 MiB\n")
    assert llama_server.kernels(log) == {"buffers": ["CPU_Mapped", "CPU_REPACK"], "cpu_backend": "libggml-cpu-zen4.so",
                                         "buffer_mib": {"CPU_Mapped": 993.15, "CPU_REPACK": 756.0}, "types": {}}
    with log.open("a") as f:
        f.write("llama_model_loader: - type  f32:  113 tensors\nllama_model_loader: - type q4_0:  196 tensors\n")
    assert llama_server.kernels(log)["types"] == {"f32": 113, "q4_0": 196}
    assert llama_server.kernels(tmp_path / "none.log") == {}
    assert body["messages"] == [workload.user_turn(workload.test_image(416, 277, seed=999))]


def test_checked_inputs_are_the_ones_that_passed_the_smoke(tmp_path, fake_binary):
    inputs = PeerInputs(fake_binary, gguf_artifact(tmp_path / "art"), {})
    assert llama_server.checked(inputs, tmp_path / "smoke.log") is inputs
    with pytest.raises(llama_server.SmokeError):
        llama_server.checked(PeerInputs(tmp_path / "art" / "manifest.json", inputs.artifact, {}), tmp_path / "s.log")


def test_a_server_that_dies_while_loading_fails_the_smoke_naming_the_signal(tmp_path):
    art = gguf_artifact(tmp_path / "art")
    crashing = tmp_path / "llama-server"
    crashing.write_text("#!/bin/sh\necho 'load_tensors: AMX model buffer size = 999.43 MiB'\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    with pytest.raises(llama_server.SmokeError, match=r"died while loading \(SIGSEGV\): load_tensors: AMX"):
        llama_server.smoke(crashing, art, tmp_path / "smoke.log")


def test_a_server_that_dies_answering_fails_the_smoke_naming_the_signal(tmp_path, fake_binary):
    art = gguf_artifact(tmp_path / "art")
    dying = tmp_path / "dying.py"  # the stand-in, killed by SIGSEGV when the request comes
    dying.write_text(f"#!{sys.executable}\n" + FAKE_SERVER.replace(
        "        body = json.loads(", "        import os, signal; os.kill(os.getpid(), signal.SIGSEGV)\n"
                                    "        body = json.loads("))
    dying.chmod(0o755)
    with pytest.raises(llama_server.SmokeError, match=r"died answering one token \(SIGSEGV\)"):
        llama_server.smoke(dying, art, tmp_path / "smoke.log", timeout=30)


def test_extra_arguments_go_at_the_end_of_the_command(tmp_path, fake_binary):
    art = gguf_artifact(tmp_path / "art")
    server = llama_server.LlamaServer(fake_binary, art, tmp_path / "s.log", extra_args=("--no-repack",))
    assert server.command[-1] == "--no-repack" and server.command[:-1] == llama_server.server_command(
        fake_binary, server.files, server.port, server.n_threads)


def test_the_bench_stops_waiting_for_a_service_whose_engine_gave_up(tmp_path):
    """The bench's tune once waited its whole ready timeout on a llamacpp engine whose llama-server had died while
    loading; /readyz's ``failed`` ends the wait at once, with the engine's reason."""
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ops.bench.server import wait_ready

    class Unready(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"ready": False, "failed": True, "reason": "model failed to load: llama-server died "
                               "while loading (SIGSEGV): ..."}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

    http = ThreadingHTTPServer(("127.0.0.1", 0), Unready)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    proc = subprocess.Popen(["sleep", "60"])  # stands for the service process, alive and unready
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"will not become ready: .*died while loading \(SIGSEGV\)"):
            wait_ready(f"http://127.0.0.1:{http.server_port}", proc, timeout=600)
        assert time.monotonic() - started < 30
    finally:
        proc.kill()
        proc.wait()
        http.shutdown()


def test_the_check_asks_each_llama_server_in_turn_about_the_same_images(tmp_path, fake_binary):
    from ops.llamacpp import check

    art = gguf_artifact(tmp_path / "art")
    configs = check.compare(fake_binary, art, tmp_path / "logs", runs=2, tokens=4, say=lambda m: None)
    assert list(configs) == ["repack", "no-repack"] and configs["no-repack"]["args"] == ["--no-repack"]
    assert all(c["runs"] == 2 and c["tokens"] == 4 and c["peak_rss_bytes"] > 0 for c in configs.values())
    bodies = [json.loads(line) for line in Path(f"{fake_binary}.bodies").read_text().splitlines()]
    assert [b["max_tokens"] for b in bodies] == [8, 8, 4, 4, 4, 4]  # both warm-ups, then the runs in turn
    images = [b["messages"][0]["content"][0]["image_url"]["url"] for b in bodies[2:]]
    assert images[0] == images[1] != images[2] == images[3]


def dying_at_load(tmp_path: Path) -> Path:
    """A llama-server that dies of SIGSEGV while loading, as the AMX build did on the 2b shape (issue 30); it counts
    its starts."""
    binary = tmp_path / "crashing-llama-server"
    binary.write_text(f"#!/bin/sh\necho x >> {tmp_path / 'starts'}\n"
                      "echo 'load_tensors: AMX model buffer size = 999.43 MiB'\nkill -SEGV $$\n")
    binary.chmod(0o755)
    return binary


def dying_answering(tmp_path: Path) -> Path:
    """The stand-in server, killed by SIGSEGV when the first request comes."""
    binary = tmp_path / "dying-llama-server"
    binary.write_text(f"#!{sys.executable}\n" + FAKE_SERVER.replace(
        "        body = json.loads(", "        import os, signal; os.kill(os.getpid(), signal.SIGSEGV)\n"
                                    "        body = json.loads("))
    binary.chmod(0o755)
    return binary


def bench_with_peer(tmp_path: Path, binary: Path, sections: tuple[str, ...]) -> dict:
    """`vlfleet bench --only <sections>` with ``binary`` as its llama-server; the int4 artifact and the checkpoint
    cannot be built here, so any section that needs them fails on its own."""
    from ops.bench import suite

    def unavailable(*_):
        raise FileNotFoundError("no 2b artifact in this test")

    art = gguf_artifact(tmp_path / "art")
    plan = Plan(sections=sections, runs=1, tokens=4, out=tmp_path / "results", log_dir=tmp_path / "logs")
    suite._SMOKES.clear()
    return suite.run(plan, unavailable, unavailable, lambda: PeerInputs(binary, art, {"version": "0.3.36"}))


def test_the_peer_section_records_a_crash_while_loading_and_the_run_goes_on(tmp_path):
    results = bench_with_peer(tmp_path, dying_at_load(tmp_path), ("peer", "tune"))
    smoke = results["peer"]["smoke"]
    assert (smoke["ok"], smoke["stage"], smoke["exit"]) == (False, "loading", "SIGSEGV")
    assert "load_tensors: AMX model buffer" in smoke["error"] and "image_416" not in results["peer"]
    assert results["peer"]["artifact"]["weight_format"]["language_model"] == "Q4_0"
    assert results["errors"]["peer"].startswith(
        "RuntimeError: llama-server crashed while loading: llama-server died while loading (SIGSEGV")
    assert "tune" in results["errors"]  # the next section ran (and failed on its own: no int4 artifact here)
    assert (tmp_path / "starts").read_text().count("x") == 1  # tune reused the peer's smoke
    saved = json.loads((tmp_path / "results" / "bench.json").read_text())
    assert saved["peer"]["smoke"] == smoke
    md = (tmp_path / "results" / "bench.md").read_text()
    assert "**llama-server crashed while loading: llama-server died while loading (SIGSEGV" in md
    assert "Traceback" not in md


def test_the_peer_section_records_a_crash_answering_its_first_token(tmp_path):
    results = bench_with_peer(tmp_path, dying_answering(tmp_path), ("peer",))
    smoke = results["peer"]["smoke"]
    assert (smoke["ok"], smoke["stage"], smoke["exit"]) == (False, "answering", "SIGSEGV")
    md = (tmp_path / "results" / "bench.md").read_text()
    assert "**llama-server crashed answering one token: llama-server died answering one token (SIGSEGV)" in md


def test_the_peer_section_measures_a_server_that_passed_its_smoke(tmp_path, fake_binary):
    results = bench_with_peer(tmp_path, fake_binary, ("peer",))
    assert results["errors"] == {} and results["peer"]["smoke"]["ok"] is True
    assert results["peer"]["image_416"]["runs"] == 1
    bodies = [json.loads(line) for line in Path(f"{fake_binary}.bodies").read_text().splitlines()]
    assert [b["max_tokens"] for b in bodies] == [1, 8, 4]  # the smoke's token, the warm-up, the run


def test_a_smoke_failure_reads_as_how_llama_server_died():
    err = llama_server.SmokeError("llama-server died while loading (SIGILL): x", "loading", "SIGILL")
    assert err.headline() == "llama-server crashed while loading: llama-server died while loading (SIGILL): x"
    slow = llama_server.SmokeError("llama-server did not become ready within 600 s", "loading")
    assert slow.headline().startswith("llama-server did not load: ")
    assert llama_server.headline({"ok": False, "stage": "start", "error": "cannot start"}) == (
        "llama-server did not start: cannot start")


def test_the_llama_steps_table_says_what_padding_a_step_gives():
    from ops.bench.bench_md import llama_steps_section

    rows = [{"sequences": n, "padded": pad, "ms_per_step": ms}
            for n, pad, ms in ((1, False, 80.0), (3, False, 240.0), (3, True, 160.0), (4, False, 160.0))]
    md = "\n".join(llama_steps_section({"llama_steps": {"threads": 2, "context": 150, "steps": 12, "rows": rows}}))
    assert "2 threads, 150 tokens of context per sequence, median of 12 steps" in md
    assert "| 3 | no | 240.0 | 3.00x | 1.00x |" in md and "| 3 | yes (a 4th row) | 160.0 | 2.00x | 1.50x |" in md
    assert "kept conversations" not in md  # a run from before the kept-conversation step was timed
    kept = {"others": 3, "tokens": 450, "alone_ms": 40.0, "beside_ms": 46.0}
    md = "\n".join(llama_steps_section({"llama_steps": {"threads": 2, "context": 150, "steps": 12, "rows": rows,
                                                         "kept": kept}}))
    assert ("beside 3 kept conversations of 450 tokens each: 46.0 ms, 1.15x its step alone in the cache (40.0 ms) "
            "with flash attention (the engine's setting).") in md
    kept["flash_attention_off"] = {"alone_ms": 50.0, "beside_ms": 60.0}
    md = "\n".join(llama_steps_section({"llama_steps": {"threads": 2, "context": 150, "steps": 12, "rows": rows,
                                                         "kept": kept}}))
    assert "(40.0 ms) with flash attention (the engine's setting), 60.0 ms, 1.20x its step alone in the cache " \
           "(50.0 ms) without it." in md
    assert llama_steps_section({}) == []


def test_the_paged_steps_table_compares_each_step_with_one_sequence():
    from ops.bench.bench_md import paged_steps_section

    rows = [{"sequences": n, "ms_per_step": ms} for n, ms in ((1, 50.0), (2, 55.0), (4, 62.5))]
    md = "\n".join(paged_steps_section({"paged_steps": {"context": 150, "steps": 12, "rows": rows}}))
    assert "150 tokens of context per sequence, median of 12 steps" in md
    assert "| 4 | 62.5 | 1.25x | 3.20x |" in md and "| 1 | 50.0 | 1.00x | 1.00x |" in md
    assert "in one call" not in md  # a run from before the fused turn was timed
    fused = {"chunk": 128, "others": 3, "chunk_ms": 300.0, "step_ms": 60.0, "together_ms": 306.0}
    md = "\n".join(paged_steps_section({"paged_steps": {"context": 150, "steps": 12, "rows": rows, "fused": fused}}))
    assert ("A prompt chunk of 128 tokens: 300.0 ms; 3 sequences' decode step: 60.0 ms; the two in one call as the "
            "paged engine makes it (125 prompt tokens and the step's 3 rows): 306.0 ms, 0.85x the two calls apart "
            "(360.0 ms).") in md
    assert paged_steps_section({}) == []


def test_the_peer_section_names_the_patches_its_build_carries():
    from ops.bench.bench_md import peer_section

    def line(build: dict) -> str:
        return peer_section({"peer": {"build": {"version": "0.3.36", **build}, "image_416": {}}})[2]

    patched = line({"patch_names": ["0001-a.patch", "0002-b.patch"]})
    assert "0.3.36 sdist with 0001-a.patch, 0002-b.patch (ops/llamacpp/patches), built here" in patched
    assert "0.3.36 sdist with no patches, built here" in line({"patch_names": []})
    assert "0.3.36 sdist, built here" in line({})  # a run from before builds recorded their patches

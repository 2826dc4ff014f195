"""The llamacpp engine's parts that need no llama-server: its request, its command line, its image-token count."""

from __future__ import annotations

import base64
import io
import json
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from service.engine import LlamaCppEngine, make_engine
from service.engine.conversation import Conversation, Sampling, Turn
from service.engine.images import PreparedImage
from service.engine.llamacpp import LLAMA_GRID, LlamaPromptLimits
from service.engine.llamacpp_api import Endpoint, messages, request_body
from service.engine.llamacpp_child import ChildError, LlamaServerChild, context_size, server_command
from service.engine.prompt_limits import VisionGrid
from service.runtime.settings import load


def image(width: int = 48, height: int = 32, seed: int = 0) -> PreparedImage:
    pixels = np.random.default_rng(seed).integers(0, 256, (1, height, width, 3), dtype=np.uint8)
    return PreparedImage(pixels, f"digest-{seed}-{width}x{height}", (width, height))


def conversation() -> Conversation:
    return Conversation((Turn("user", "What is it?", (image(),)), Turn("assistant", "A cat."),
                         Turn("user", "Which colour?")))


@pytest.fixture
def gguf_artifact(tmp_path):
    files = {"language_model": "language-model-Q4_0.gguf", "mmproj": "mmproj-q8_0.gguf"}
    (tmp_path / "manifest.json").write_text(json.dumps({"weight_format": {"format": "gguf", "files": files}}))
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    return tmp_path, binary


def test_messages_send_each_image_as_a_lossless_png_before_its_turns_text():
    conv = conversation()
    sent = messages(conv)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "A cat." and sent[2]["content"] == "Which colour?"
    (part, text) = sent[0]["content"]
    assert text == {"type": "text", "text": "What is it?"} and part["type"] == "image_url"
    head, data = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64"
    decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))[None]
    assert np.array_equal(decoded, conv.images[0].pixels)  # the pixels the service prepared, exactly
    assert messages(conv) == sent  # the same image is the same bytes: llama.cpp's image hash matches on a follow-up


def test_messages_for_counting_put_a_marker_where_each_image_goes():
    assert messages(conversation(), marker="<m>")[0] == {"role": "user", "content": "<m>What is it?"}


def test_request_is_streamed_greedy_by_default_and_reuses_the_cached_prompt():
    body = request_body(conversation(), Sampling(max_tokens=16))
    assert body["stream"] is True and body["cache_prompt"] is True and body["stream_options"]["include_usage"]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16 and body["ignore_eos"] is False
    assert body["top_k"] == 0 and body["min_p"] == 0.0  # sampling follows temperature and top_p alone
    assert "seed" not in body and "stop" not in body
    sampled = request_body(conversation(), Sampling(max_tokens=4, temperature=0.7, top_p=0.9, seed=3, stop=("\n",),
                                                    ignore_eos=True))
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"], sampled["stop"], sampled["ignore_eos"]) == (
        0.7, 0.9, 3, ["\n"], True)


def test_an_endpoint_sends_its_key():
    assert Endpoint(1234, "k").headers() == {"Authorization": "Bearer k", "Content-Type": "application/json"}
    assert Endpoint(1234, "k").headers(body=False) == {"Authorization": "Bearer k"}


def test_llama_cpp_rounds_the_image_grid_half_away_from_zero():
    # 448x336: 336 / 32 = 10.5 rows of merged patches. Python's round gives 10, llama.cpp's (C) gives 11.
    assert VisionGrid(min_pixels=8192, max_pixels=4096 * 1024).tokens(448, 336) == 14 * 10
    assert LLAMA_GRID.tokens(448, 336) == 14 * 11
    assert LLAMA_GRID.tokens(96, 64) == 4 * 3  # below 8 tokens: scaled up to at least 8192 pixels
    assert LLAMA_GRID.tokens(448, 448) == 14 * 14


def test_the_command_runs_llama_server_on_loopback_with_one_slot(gguf_artifact):
    artifact, binary = gguf_artifact
    settings = load({"VLFLEET_MODEL_DIR": str(artifact), "VLFLEET_LLAMACPP_SERVER": str(binary),
                     "VLFLEET_THREADS": "3", "VLFLEET_MAX_INPUT_TOKENS": "1000", "VLFLEET_MAX_TOKENS": "200"})
    cmd = server_command(settings)
    assert cmd[0] == str(binary)
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert flags["-m"] == str(artifact / "language-model-Q4_0.gguf")
    assert flags["--mmproj"] == str(artifact / "mmproj-q8_0.gguf")
    assert flags["-t"] == flags["-tb"] == "3" and flags["-np"] == "1"
    assert flags["-c"] == "1200" == str(context_size(settings))  # the longest prompt plus the longest answer
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "0"  # loopback, a port the kernel picks
    assert flags["--cache-ram"] == "2048"  # VLFLEET_KV_CACHE_GB, not llama-server's 8 GiB default
    assert context_size(settings.replace(llamacpp_ctx=4096)) == 4096


def test_a_missing_binary_or_an_openvino_artifact_is_named(gguf_artifact, tmp_path):
    artifact, _ = gguf_artifact
    settings = load({"VLFLEET_MODEL_DIR": str(artifact), "VLFLEET_LLAMACPP_SERVER": str(tmp_path / "nope")})
    with pytest.raises(ChildError, match="set VLFLEET_LLAMACPP_SERVER"):
        server_command(settings)
    ir = tmp_path / "ir"
    ir.mkdir()
    (ir / "manifest.json").write_text(json.dumps({"weight_format": {"format": "int4"}}))
    with pytest.raises(ChildError, match="is not a GGUF artifact"):
        server_command(settings.replace(model_dir=ir))


def test_vlfleet_engine_llamacpp_makes_the_llamacpp_engine(gguf_artifact):
    artifact, _ = gguf_artifact
    engine = make_engine(load({"VLFLEET_MODEL_DIR": str(artifact), "VLFLEET_ENGINE": "llamacpp"}))
    assert isinstance(engine, LlamaCppEngine) and isinstance(engine.limits, LlamaPromptLimits)
    assert not engine.ready.is_set()  # nothing starts before start()


# A stand-in for llama-server: binds the port it is given (0: one the kernel picks), says where it listens as
# llama-server does, and answers /health only to a request carrying the key it got in LLAMA_API_KEY (none: any).
FAKE_SERVER = r"""
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
key = os.environ.get("LLAMA_API_KEY", "")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        ok = self.path == "/health" or not key or self.headers.get("Authorization") == "Bearer " + key
        self.send_response(200 if ok else 401)
        self.end_headers()
server = HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H)
print(f"main: server is listening on http://127.0.0.1:{server.server_port} - starting the main loop", flush=True)
server.serve_forever()
"""


@pytest.fixture
def fake_llama_server(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    binary.chmod(0o755)
    return binary


def get(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_child_learns_its_port_from_its_output_and_wants_its_key(fake_llama_server):
    child = LlamaServerChild([str(fake_llama_server), "--port", "0"])
    child.start(30)
    try:
        endpoint = child.endpoint()
        assert endpoint is not None and endpoint.port > 0 and len(endpoint.key) >= 24
        assert get(f"{child.url}/props") == 401 and get(f"{child.url}/props", endpoint.headers(body=False)) == 200
        assert any("listening on" in line for line in child.tail)
    finally:
        child.stop()
    assert not child.alive() and child.endpoint() is None


def test_a_fixed_port_without_a_key_writes_its_output_to_the_log_file(fake_llama_server, tmp_path):
    from ops.bench.server import free_port

    port, log_file = free_port(), tmp_path / "llama-server.log"
    child = LlamaServerChild([str(fake_llama_server), "--port", str(port)], log_file=log_file, key=False)
    child.start(30)
    try:
        assert child.port == port and get(f"http://127.0.0.1:{port}/props") == 200
    finally:
        child.stop()
    assert "listening on" in log_file.read_text()


def test_a_child_that_dies_while_loading_is_named_with_its_last_words(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 3\n")
    binary.chmod(0o755)
    with pytest.raises(ChildError, match=r"died while loading \(exit code 3\): error: failed to load model") as e:
        LlamaServerChild([str(binary), "--port", "0"]).start(30)
    assert e.value.died and e.value.exit_code == 3


def crashing_server(tmp_path, after: int = 0):
    """A llama-server that dies of SIGSEGV while loading (as llama.cpp's AMX kernels did on the 2b model, issue 30),
    from its ``after``-th start on; the starts before that are the stand-in server."""
    binary, starts = tmp_path / "llama-server", tmp_path / "starts"
    binary.write_text(f"""#!/bin/sh
echo x >> {starts}
if [ "$(wc -l < {starts})" -gt {after} ]; then
  echo 'load_tensors: AMX model buffer size = 999.43 MiB'
  kill -SEGV $$
fi
exec {sys.executable} {tmp_path / "fake.py"} "$@"
""")
    (tmp_path / "fake.py").write_text(FAKE_SERVER)
    binary.chmod(0o755)
    return binary


def test_a_signal_is_named(tmp_path):
    from service.engine.llamacpp_child import describe_exit

    assert [describe_exit(c) for c in (-11, -9, 3, 0, None)] == ["SIGSEGV", "SIGKILL", "exit code 3", "exit code 0",
                                                                 "still running"]
    with pytest.raises(ChildError, match=r"died while loading \(SIGSEGV\): load_tensors: AMX model buffer") as e:
        LlamaServerChild([str(crashing_server(tmp_path)), "--port", "0"]).start(30)
    assert e.value.exit_code == -11


def llamacpp_engine(gguf_artifact, binary, **env):
    artifact, _ = gguf_artifact
    settings = load({"VLFLEET_MODEL_DIR": str(artifact), "VLFLEET_ENGINE": "llamacpp", "VLFLEET_WARMUP": "false",
                     "VLFLEET_LLAMACPP_SERVER": str(binary), "VLFLEET_LLAMACPP_START_TIMEOUT": "600", **env})
    engine = make_engine(settings)
    engine.start()
    return engine


def wait_until(condition, timeout: float = 30):
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def readyz(engine) -> tuple[dict, int]:
    import types

    from flask import Flask

    from service.http.health import bp

    app = Flask("t")
    app.register_blueprint(bp)
    app.extensions["vlfleet"] = types.SimpleNamespace(
        engine=engine, settings=engine.settings, artifact_id="a", started=0.0)
    answer = app.test_client().get("/readyz")
    return answer.get_json(), answer.status_code


def test_an_engine_whose_llama_server_dies_while_loading_gives_up_at_once(gguf_artifact, tmp_path):
    """Not after VLFLEET_LLAMACPP_START_TIMEOUT (600 s here): /readyz says failed, naming the signal."""
    engine = llamacpp_engine(gguf_artifact, crashing_server(tmp_path))
    try:
        wait_until(lambda: engine.gave_up)
        body, status = readyz(engine)
        assert status == 503 and body["failed"] is True and not body["ready"]
        assert body["reason"].startswith("model failed to load: llama-server died while loading (SIGSEGV): ")
    finally:
        engine._stop_child()


def test_a_restart_that_dies_while_loading_is_not_tried_again(gguf_artifact, tmp_path):
    """It served, was killed, and its restart died of SIGSEGV while loading: the engine gives up on the first try
    (of 5) instead of crash-looping through the back-off."""
    import signal

    engine = llamacpp_engine(gguf_artifact, crashing_server(tmp_path, after=1), VLFLEET_LLAMACPP_RESTARTS="5")
    try:
        wait_until(engine.ready.is_set)
        assert readyz(engine)[1] == 200
        engine.pipeline.proc.send_signal(signal.SIGKILL)  # the stand-in server this test started
        wait_until(lambda: engine.gave_up)
        body, status = readyz(engine)
        assert status == 503 and body["failed"] is True
        assert "died while loading (SIGSEGV)" in body["reason"] and "stopped while serving (SIGKILL)" in body["reason"]
        assert "restart 1 of 5" in body["reason"] and (tmp_path / "starts").read_text().count("x") == 2
    finally:
        engine._stop_child()


def test_readyz_says_failed_only_when_the_engine_gave_up(gguf_artifact, tmp_path):
    engine = make_engine(load({"VLFLEET_MODEL_DIR": str(gguf_artifact[0]), "VLFLEET_ENGINE": "llamacpp"}))
    body, status = readyz(engine)
    assert status == 503 and body["reason"] == "model loading" and "failed" not in body
    engine.failed = "llama-server died (SIGKILL); restarting it (attempt 1 of 3)"
    assert readyz(engine)[0]["failed"] is False
    engine._give_up("model failed to load: boom")
    assert readyz(engine)[0]["failed"] is True and readyz(engine)[0]["reason"] == "model failed to load: boom"

"""VLFLEET_ENGINE=llamacpp: the real service on the tiny GGUF artifact, with its real llama-server child, through
real clients (the openai client, curl): streamed SSE, prompt re-use on a follow-up, cancellation, the prompt limit
counted as llama-server counts, and a killed llama-server making the service unready until the engine restarts it.

llama-server comes from the project's cached build (ops.llamacpp.build, default native config): built once per
machine and CPU (at -O1, ops.llamacpp.build.test_config), then found in the cache.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from tests import servers
from tests.integration.conftest import image_message, png_bytes

MODEL = "qwen3-vl-2b-instruct"
LIMIT = 2048  # VLFLEET_MAX_INPUT_TOKENS of the module's service
MAX_TOKENS = 30000  # long enough that an ignore_eos answer is still running when the client hangs up


def start(tiny_gguf: Path, llama_server: Path, log_dir: Path, **env: str) -> servers.Server:
    return servers.start(tiny_gguf, log_dir, VLFLEET_ENGINE="llamacpp", VLFLEET_LLAMACPP_SERVER=str(llama_server),
                         VLFLEET_LLAMACPP_START_TIMEOUT="120", **env)


@pytest.fixture(scope="module")
def service(tiny_gguf, llama_server, tmp_path_factory):
    server = start(tiny_gguf, llama_server, tmp_path_factory.mktemp("llamacpp"), VLFLEET_MAX_TOKENS=str(MAX_TOKENS),
                   VLFLEET_MAX_INPUT_TOKENS=str(LIMIT))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(service):
    return OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def llama_children(server: servers.Server) -> list[psutil.Process]:
    """The llama-server processes under the service we started (gunicorn master -> worker -> llama-server)."""
    return [p for p in psutil.Process(server.proc.pid).children(recursive=True) if p.name() == "llama-server"]


def request_id() -> dict:
    """A request id of its own for a request (its inference log line is found by it)."""
    return {"X-Request-Id": uuid.uuid4().hex[:16]}


def test_a_streamed_answer_arrives_over_sse(client, service):
    streamed, replayed = request_id(), request_id()
    stream = client.chat.completions.create(model=MODEL, messages=[image_message("What is on the table?")],
                                            max_tokens=8, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}, extra_headers=streamed)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.prompt_tokens > 14  # the image's tokens
    # The same greedy request again: the answer cache replays the same text.
    again = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[image_message("What is on the table?")], max_tokens=8, extra_body={"ignore_eos": True},
        extra_headers=replayed)
    assert again.headers["X-Cache"] == "hit" and again.parse().choices[0].message.content == text
    # The streamed answer's line is written after its last event went out, the replay's before its answer: the
    # streamed one can be the later of the two, so wait for both.
    [line], [hit] = service.wait_inference_lines(streamed["X-Request-Id"], replayed["X-Request-Id"])
    assert line["cache"] == "miss" and line["completion_tokens"] == 8 and line["images"] == 1
    assert hit["cache"] == "hit" and hit["completion_tokens"] == 8


def test_the_web_ui_stream_carries_the_service_events(service, tmp_path):
    image = tmp_path / "picture.png"
    image.write_bytes(png_bytes((160, 120), (30, 90, 200)))
    out = subprocess.run(["curl", "-sS", "-N", "--max-time", "60", "-F", f"image=@{image}", "-F",
                          "question=What is in this picture?", "-F", "max_tokens=5", service.url + "/chat"],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    kinds = [block.split("\n", 1)[0].removeprefix("event: ") for block in out.strip().split("\n\n")
             if "data: " in block]
    assert kinds[0] == "status" and "token" in kinds and kinds[-1] == "done"
    done = json.loads(out.strip().split("\n\n")[-1].split("data: ", 1)[1])
    assert done["session"] and done["timings"]["completion_tokens"] >= 1


def test_a_follow_up_resending_image_and_history_reuses_the_cached_prompt(client, service):
    question = image_message("Which fruit is on the left?", png_bytes((200, 150), (10, 160, 40)))
    first = client.chat.completions.create(model=MODEL, messages=[question], max_tokens=6)
    cached_before = service.metric("vlfleet_reused_prompt_tokens_total")
    history = [question, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "And on the right?"}]
    ids = request_id()
    follow = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=6, messages=history,
                                                              extra_headers=ids)
    assert follow.headers["X-Session-Reused"] == "1"
    # llama-server took at least the whole first prompt (image included) from its KV cache.
    assert service.metric("vlfleet_reused_prompt_tokens_total") - cached_before >= first.usage.prompt_tokens
    assert follow.parse().usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    # The log line is written just after the answer's last event: wait for it.
    [[line]] = service.wait_inference_lines(ids["X-Request-Id"])
    assert line["prompt_tokens"] == follow.parse().usage.prompt_tokens and line["prefix_reuse"] is True


def test_a_client_that_hangs_up_frees_the_engine(client, service):
    cancelled = service.metric("vlfleet_cancelled_requests_total")
    ids = request_id()
    stream = client.chat.completions.create(model=MODEL, messages=[image_message("Count to a million.")],
                                            max_tokens=MAX_TOKENS, stream=True, extra_body={"ignore_eos": True},
                                            extra_headers=ids)
    pieces = 0
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        if pieces >= 3:
            break
    stream.close()  # the client goes away mid-answer
    servers.wait_for(lambda: service.metric("vlfleet_cancelled_requests_total") > cancelled, 30, "the cancellation")
    started = time.monotonic()
    after = client.chat.completions.create(model=MODEL, messages=[image_message("And now?")], max_tokens=4)
    assert after.choices[0].message.content is not None and time.monotonic() - started < 20
    [[stopped]] = service.wait_inference_lines(ids["X-Request-Id"])
    assert stopped["finish_reason"] == "cancelled" and 3 <= stopped["completion_tokens"] < MAX_TOKENS


def test_a_prompt_over_the_limit_is_a_400_naming_limit_and_count(client):
    with pytest.raises(Exception) as refused:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
            image_message("Read this: " + "the invoice lists three items " * 2000)])
    assert refused.value.status_code == 400
    error = refused.value.body  # the openai client's body is the "error" object
    assert error["code"] == "context_length_exceeded" and "VLFLEET_MAX_INPUT_TOKENS" in error["message"]
    assert f"the limit is {LIMIT}" in error["message"]


def test_the_limit_counts_tokens_as_llama_server_does(client, service, tiny_gguf, llama_server, tmp_path):
    """A 448x336 image (640x480 downscaled: 14 x 11 merged patches in llama.cpp's rounding) and a follow-up: a
    service whose limit is one token short refuses exactly the count llama-server reported, and its child goes
    when it stops."""
    messages = [image_message("Describe it. ", png_bytes((640, 480))), {"role": "assistant", "content": "ok then"},
                {"role": "user", "content": " what?  \n"}]
    prompt = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).usage.prompt_tokens
    short = start(tiny_gguf, llama_server, tmp_path, VLFLEET_MAX_INPUT_TOKENS=str(prompt - 1))
    try:
        (child,) = llama_children(short)
        with pytest.raises(Exception) as refused:
            OpenAI(base_url=short.url + "/v1", api_key="unused", max_retries=0, timeout=60).chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2)
        assert refused.value.status_code == 400
        assert f"the prompt is {prompt} tokens" in refused.value.body["message"]
    finally:
        short.stop()
    child.wait(timeout=15)  # stopping the service stopped its llama-server
    assert not child.is_running()


def test_a_killed_llama_server_makes_the_service_unready_until_restarted(client, service):
    (child,) = llama_children(service)
    child.send_signal(signal.SIGKILL)  # a child of the service this module started
    servers.wait_for(lambda: servers.get(service.url + "/readyz")[0] == 503, 15, "/readyz 503")
    reason = servers.get(service.url + "/readyz")[1].get("reason", "")
    assert "llama-server" in reason
    servers.wait_for(lambda: servers.get(service.url + "/readyz")[0] == 200, 120, "/readyz 200 again")
    (restarted,) = llama_children(service)
    assert restarted.pid != child.pid
    assert service.metric("vlfleet_engine_restarts_total") == 1
    answer = client.chat.completions.create(model=MODEL, messages=[image_message("Still there?")], max_tokens=4)
    assert answer.usage.completion_tokens >= 1


def test_a_llama_server_that_dies_while_loading_fails_the_service_and_tune_at_once(tiny_gguf, tmp_path,
                                                                                   monkeypatch):
    """VLFLEET_LLAMACPP_SERVER names a llama-server that dies of SIGSEGV while loading (as the AMX build did on the
    2b shape, issue 30): /readyz says ``failed`` with the signal long before the engine's start timeout (600 s), and
    both waits that tune uses stop there with that reason (the host program's, whose candidate is then failed with it;
    the bench's): within their 90 s they would otherwise end as "not ready", and fail the test."""
    from ops.bench.server import Server
    from ops.host import gate

    crashing = tmp_path / "llama-server"
    crashing.write_text("#!/bin/sh\necho 'load_tensors: AMX model buffer size = 999.43 MiB'\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    env = {"VLFLEET_ENGINE": "llamacpp", "VLFLEET_LLAMACPP_SERVER": str(crashing),
           "VLFLEET_LLAMACPP_START_TIMEOUT": "600"}
    server = servers.start(tiny_gguf, tmp_path, wait=False, **env)
    try:
        # a host's systemd reads, as they are while the unit runs (this machine has no such unit)
        monkeypatch.setattr(gate, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running"})
        monkeypatch.setattr(gate, "journal_tail", lambda unit, since: [])
        started = time.monotonic()
        out = gate.wait_ready(("127.0.0.1", server.port), "vlfleet", lambda body: True, timeout=90,
                                    since=None, restarts=0, poll=0.25)
        assert time.monotonic() - started < 60, out
        assert out["ok"] is False and "died while loading (SIGSEGV" in out["reason"], out
        assert "load_tensors: AMX model buffer" in out["reason"]
        status, body = servers.get(server.url + "/readyz")
        assert status == 503 and body["failed"] is True
    finally:
        server.stop()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"will not become ready: .*died while loading \(SIGSEGV"):
        Server(tiny_gguf, tmp_path / "bench-tune.log", env, ready_timeout=90).__enter__()
    assert time.monotonic() - started < 60

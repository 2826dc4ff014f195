"""The service as clients use it: the official openai client, curl -N, and the plain endpoints."""

from __future__ import annotations

import json
import subprocess

import pytest
from openai import OpenAI

from service import manifest as mf
from tests import servers
from tests.integration.conftest import image_message, png_bytes


@pytest.fixture(scope="module")
def client(service):
    return OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_non_streaming(client):
    completion = client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()],
                                                max_tokens=6)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.usage.completion_tokens >= 1
    assert completion.usage.prompt_tokens > 10  # the image's tokens are in the prompt
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_openai_client_streaming_with_usage(client):
    stream = client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()], max_tokens=8,
                                            stream=True, stream_options={"include_usage": True}, extra_body={
                                                "ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    # The streamed pieces add up to the answer the same greedy request gets in one piece.
    whole = client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()], max_tokens=8,
                                           extra_body={"ignore_eos": True})
    assert text == whole.choices[0].message.content


def test_max_tokens_is_capped_by_server_maximum(client, service):
    completion = client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()],
                                                max_tokens=100_000, extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 4096  # VLFLEET_MAX_TOKENS of the fixture
    assert completion.choices[0].finish_reason == "length"


def test_greedy_answers_are_reproducible(client):
    ask = dict(model="qwen3-vl-2b-instruct", messages=[image_message("Describe it.")], max_tokens=12)
    first = client.chat.completions.create(**ask).choices[0].message.content
    second = client.chat.completions.create(**ask).choices[0].message.content
    assert first == second


def test_follow_up_continues_the_cached_conversation(client):
    first = client.chat.completions.with_raw_response.create(
        model="qwen3-vl-2b-instruct", messages=[image_message("What is this?", )], max_tokens=6)
    answer = first.parse().choices[0].message.content
    follow = client.chat.completions.with_raw_response.create(
        model="qwen3-vl-2b-instruct", max_tokens=6,
        messages=[image_message("What is this?"), {"role": "assistant", "content": answer},
                  {"role": "user", "content": "And what colour is it?"}])
    assert first.headers["X-Session-Reused"] == "0"
    assert follow.headers["X-Session-Reused"] == "1"
    # A history the server has never seen still works (images ride with the last question).
    unknown = client.chat.completions.with_raw_response.create(
        model="qwen3-vl-2b-instruct", max_tokens=4,
        messages=[image_message("What is this?"), {"role": "assistant", "content": "something else entirely"},
                  {"role": "user", "content": "Really?"}])
    assert unknown.headers["X-Session-Reused"] == "0"
    assert unknown.parse().choices[0].message.content is not None


def _ui_chat(service, *fields: str) -> dict:
    """POST /chat as the web UI does (multipart, through curl); returns the answer and the done event."""
    form = [arg for field in fields for arg in ("-F", field)]
    out = subprocess.run(["curl", "-sS", "-N", "--max-time", "60", *form, service.url + "/chat"],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    events = [(block.split("\n", 1)[0].removeprefix("event: "), json.loads(block.split("data: ", 1)[1]))
              for block in out.strip().split("\n\n") if "data: " in block]
    done = next(data for kind, data in events if kind == "done")
    status = next(data for kind, data in events if kind == "status")
    return {"text": "".join(data["text"] for kind, data in events if kind == "token"), "status": status, **done}


def test_web_ui_follow_up_answers_as_the_whole_conversation_would(client, service, tmp_path):
    """A follow-up naming its session (question only) renders the same prompt as the whole conversation
    re-sent through the OpenAI API: the same greedy answer."""
    image = tmp_path / "picture.png"
    image.write_bytes(png_bytes((160, 120), (30, 90, 200)))
    first = _ui_chat(service, f"image=@{image}", "question=What is in this picture?", "max_tokens=6")
    follow = _ui_chat(service, f"session={first['session']}", "question=Which colour dominates?", "max_tokens=6")
    assert follow["status"]["reused_session"] is True
    whole = client.chat.completions.create(model="qwen3-vl-2b-instruct", max_tokens=6, messages=[
        image_message("What is in this picture?", image.read_bytes()),
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "Which colour dominates?"}])
    assert follow["text"] == whole.choices[0].message.content


def test_curl_streams_sse_until_done(service, tmp_path):
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"messages": [image_message()], "stream": True, "max_tokens": 5}))
    out = subprocess.run(["curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{body}", service.url + "/v1/chat/completions"],
                         capture_output=True, text=True, check=True).stdout
    events = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_models_health_ready_openapi(service, tiny_model):
    status, models = servers.get(service.url + "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "qwen3-vl-2b-instruct"
    assert servers.get(service.url + "/healthz") == (200, {"status": "alive"})
    status, ready = servers.get(service.url + "/readyz")
    assert status == 200 and ready["ready"] is True
    assert ready["artifact_id"] == mf.read_manifest(tiny_model)["artifact_id"]
    status, doc = servers.get(service.url + "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/chat", "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert path in doc["paths"], path


def test_metrics_exports_the_documented_families(service, client):
    client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()], max_tokens=3)
    status, text = servers.get(service.url + "/metrics")
    assert status == 200
    for name in ("vlfleet_requests_total", "vlfleet_rejected_requests_total", "vlfleet_queue_depth",
                 "vlfleet_in_flight_requests", "vlfleet_time_to_first_token_seconds_bucket",
                 "vlfleet_request_duration_seconds_bucket", "vlfleet_generated_tokens_total",
                 "vlfleet_image_encode_seconds_bucket", "vlfleet_model_info", "vlfleet_ready 1.0"):
        assert name in text, name
    assert 'vlfleet_requests_total{endpoint="/v1/chat/completions",status="200"}' in text

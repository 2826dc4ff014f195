"""The continuous-batching engine (VLFLEET_ENGINE=batching): concurrent streams share decode steps."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from openai import OpenAI

from tests import servers
from tests.integration.conftest import image_message, png_bytes

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def batching(tiny_model, tmp_path_factory):
    server = servers.start(tiny_model, tmp_path_factory.mktemp("batching"), VLFLEET_ENGINE="batching",
                           VLFLEET_MAX_BATCH="4", VLFLEET_MAX_TOKENS="4096", VLFLEET_ANSWER_CACHE_MB="0")
    yield server
    server.stop()


def timed_stream(url: str, question: str, tokens: int, out: dict) -> None:
    body = {"messages": [image_message(question)], "max_tokens": tokens, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    first = last = None
    count = 0
    with requests.post(url + CHAT, json=body, stream=True, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith(b'data: {"id"') and b'"content":"' in line and b'"content":""' not in line:
                first = first or time.monotonic()
                last = time.monotonic()
                count += 1
    out[question] = (r.status_code, start, first, last, count)


def test_openai_client_streams(batching):
    client = OpenAI(base_url=batching.url + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()],
                                                 max_tokens=6, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # The same greedy request in one piece (the fixture has no answer cache: generated again).
    whole = client.chat.completions.create(model="qwen3-vl-2b-instruct", messages=[image_message()], max_tokens=6,
                                           extra_body={"ignore_eos": True})
    assert text == whole.choices[0].message.content


def test_concurrent_streams_generate_at_the_same_time(batching):
    results: dict = {}
    threads = [threading.Thread(target=timed_stream, args=(batching.url, f"question {i}", 1500, results))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 3 and all(r[0] == 200 and r[4] > 0 for r in results.values())
    # Interleaved, not queued: every stream got its first token before any other stream finished.
    last_first = max(r[2] for r in results.values())
    first_last = min(r[3] for r in results.values())
    assert last_first < first_last


def test_earlier_turn_images_stay_in_place(batching):
    client = OpenAI(base_url=batching.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="qwen3-vl-2b-instruct", max_tokens=4, messages=[
        image_message("What is this?", png_bytes((64, 64), (0, 0, 255))), {"role": "assistant", "content": "blue"},
        image_message("And this one?", png_bytes((64, 64), (255, 0, 0)))])
    assert reply.usage.prompt_tokens > 20 and reply.choices[0].message.content is not None


def test_disconnect_cancels_and_others_continue(batching):
    r = requests.post(batching.url + CHAT, stream=True, timeout=60, json={
        "messages": [image_message()], "max_tokens": 4096, "ignore_eos": True, "stream": True})
    lines = r.iter_lines()
    next(lines)
    r.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = servers.get(batching.url + "/metrics")[1]
        if "vlfleet_cancelled_requests_total 1.0" in metrics:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("cancellation not counted")
    ok = requests.post(batching.url + CHAT, json={"messages": [image_message()], "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200

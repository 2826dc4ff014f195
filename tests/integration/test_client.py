"""ops/host/client.py against the real service on the tiny model: a streamed answer with its timings, tokens and
headers, the same answer not streamed, the JSON error of a bad request, and /readyz waits (one that gives up)."""

from __future__ import annotations

import time
import uuid

import pytest

from ops.host import client
from tests.integration.conftest import image_message
from tests.servers import free_port


def _body(stream: bool, nonce: str, **extra) -> dict:
    # a nonce in the question: the shared service's answer cache would replay an earlier test's answer
    return {"messages": [image_message(f"What is in this image? ({nonce})")], "max_tokens": 8, "ignore_eos": True,
            "stream": stream, **extra}


def test_a_streamed_answer_and_the_same_one_from_the_cache(service):
    nonce, pieces = uuid.uuid4().hex, []
    streamed = client.chat(service.url, _body(True, nonce, stream_options={"include_usage": True}), timeout=120,
                           on_text=pieces.append)
    assert streamed.error is None and streamed.status == 200 and streamed.done, streamed
    assert streamed.tokens == 8 and streamed.chunks == len(pieces) >= 1 and streamed.text == "".join(pieces)
    assert 0 < streamed.first_token_s <= streamed.last_token_s <= streamed.finish_s <= streamed.total_s
    assert streamed.headers["X-Cache"] == "miss" and streamed.headers["X-Served-By"]
    # The cache's key ignores `stream`: the same request not streamed is a hit with the text the stream carried.
    whole = client.chat(service.url, _body(False, nonce), timeout=120)
    assert whole.error is None and whole.headers["X-Cache"] == "hit", whole
    assert whole.text == streamed.text and whole.tokens == 8 and whole.body["object"] == "chat.completion"
    assert whole.check() is whole


def test_a_bad_request_is_its_status_and_the_json_errors_message(service):
    a = client.chat(service.url, _body(True, uuid.uuid4().hex, max_tokens=-1), timeout=60)
    assert a.status == 400 and a.error.startswith("HTTP 400: ") and "max_tokens" in a.error, a
    assert not a.done and a.first_token_s is None
    with pytest.raises(client.ChatError, match=r"HTTP 400: .*max_tokens"):
        a.check()


def test_wait_ready_of_the_running_service(service):
    seconds, body = client.wait_ready(service.url, timeout=30)
    assert 0 <= seconds < 30 and body["ready"] is True
    engine = body["engine"]
    with pytest.raises(client.NotReady, match=r"not ready after 1 s \(last /readyz: HTTP 200"):
        client.wait_ready(service.url, timeout=1, accept=lambda b: b.get("engine") != engine)


def test_wait_ready_gives_up_with_the_last_error():
    started = time.monotonic()
    with pytest.raises(client.NotReady, match=r"not ready after 1 s \(last /readyz: URLError: .*refused"):
        client.wait_ready(f"http://127.0.0.1:{free_port()}", timeout=1)
    assert time.monotonic() - started < 10

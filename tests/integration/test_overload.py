"""Queue overflow (429), queue timeout (503) and vanished clients, on a service with a one-slot queue."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests import servers
from tests.integration.conftest import image_message

CHAT = "/v1/chat/completions"
LONG = 16384  # tokens: keeps the inference thread busy for many seconds on the tiny model


@pytest.fixture(scope="module")
def small_queue(tiny_model, tmp_path_factory):
    server = servers.start(tiny_model, tmp_path_factory.mktemp("overload"), VLFLEET_QUEUE_SIZE="1",
                           VLFLEET_QUEUE_TIMEOUT="2", VLFLEET_MAX_TOKENS=str(LONG))
    yield server
    server.stop()


def start_long_stream(server):
    """A streaming request that occupies the inference thread; returns once its first token arrived.

    Returns the response and its line iterator: dropping the iterator would close the connection.
    """
    response = requests.post(server.url + CHAT, stream=True, timeout=60, json={
        "messages": [image_message()], "stream": True, "max_tokens": LONG, "ignore_eos": True})
    assert response.status_code == 200
    lines = response.iter_lines()
    for _ in range(3):  # role chunk, then content chunks
        next(lines)
    return response, lines


def test_queue_full_gets_429_then_queue_timeout_gets_503(small_queue):
    cancelled = small_queue.metric("vlfleet_cancelled_requests_total")
    busy, _lines = start_long_stream(small_queue)
    waiting: dict = {}
    queued = threading.Thread(target=lambda: waiting.update(r=requests.post(small_queue.url + CHAT, timeout=60, json={
        "messages": [image_message()], "max_tokens": 2})))
    queued.start()
    try:
        servers.wait_for(lambda: small_queue.metric("vlfleet_queue_depth") == 1, what="the second request to queue")
        over = requests.post(small_queue.url + CHAT, timeout=10, json={"messages": [image_message()]})
        assert over.status_code == 429
        assert int(over.headers["Retry-After"]) >= 1
        assert over.json()["error"]["type"] == "rate_limit_error"
        queued.join(timeout=30)
        assert waiting["r"].status_code == 503  # waited past VLFLEET_QUEUE_TIMEOUT=2
        assert "VLFLEET_QUEUE_TIMEOUT" in waiting["r"].json()["error"]["message"]
    finally:
        busy.close()
        # The long job is cancelled before the next test starts, or its cancellation would be counted as theirs.
        servers.wait_for(lambda: small_queue.metric("vlfleet_cancelled_requests_total") == cancelled + 1,
                         what="the long stream's cancellation")
    assert servers.get(small_queue.url + "/readyz")[0] == 200
    assert small_queue.metric('vlfleet_rejected_requests_total{reason="429"}') >= 1


def test_client_disconnect_cancels_generation_and_next_request_is_served(small_queue):
    before = small_queue.metric("vlfleet_cancelled_requests_total")
    busy, _lines = start_long_stream(small_queue)
    busy.close()  # the client goes away mid-stream
    servers.wait_for(lambda: small_queue.metric("vlfleet_cancelled_requests_total") == before + 1, what="cancellation")
    started = time.monotonic()
    after = requests.post(small_queue.url + CHAT, timeout=60, json={"messages": [image_message()], "max_tokens": 3})
    assert after.status_code == 200
    assert after.json()["usage"]["completion_tokens"] >= 1
    # Not a speed assertion: with the long job still running, this request would have hit the 2 s queue timeout.
    assert time.monotonic() - started < 30

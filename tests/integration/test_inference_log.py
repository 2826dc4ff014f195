"""One JSON log line per inference, with the time and resources it took, for generated and cached answers."""

from __future__ import annotations

import uuid

import requests

from tests.integration.conftest import image_message, png_bytes

FIELDS = {"request_id", "cache", "finish_reason", "images", "queue_wait_s", "image_encode_s", "first_token_s",
          "total_s", "prompt_tokens", "completion_tokens", "ms_per_token", "prefix_reuse", "rss_mib"}


def _ask(service, request_id: str, stream: bool) -> requests.Response:
    # An image of its own per request: an engine that keeps encoded images must still encode this one.
    color = tuple(bytes.fromhex(request_id[:6]))
    body = {"messages": [image_message(f"Describe it. {request_id}", png_bytes(color=color))],
            "max_tokens": 6, "ignore_eos": True, "stream": stream}
    r = requests.post(service.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id},
                      timeout=120)
    r.raise_for_status()
    return r


def test_streamed_answer_logs_one_line_with_every_field(service):
    rid = uuid.uuid4().hex[:16]
    assert "data: [DONE]" in _ask(service, rid, stream=True).text
    [[line]] = service.wait_inference_lines(rid)
    assert set(line) >= FIELDS, FIELDS - set(line)
    assert line["cache"] == "miss" and line["finish_reason"] == "length" and line["images"] == 1
    assert line["completion_tokens"] == 6 and line["prompt_tokens"] > 6
    assert 0 < line["first_token_s"] <= line["total_s"] and line["ms_per_token"] > 0
    assert line["image_encode_s"] > 0 and line["queue_wait_s"] >= 0 and line["rss_mib"] > 50
    assert line["prefix_reuse"] is False


def test_cached_answer_logs_a_hit(service):
    first, again = uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
    body = {"messages": [{"role": "user", "content": f"Say something about {first}."}], "max_tokens": 4,
            "temperature": 0}
    for rid in (first, again):
        r = requests.post(service.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}, timeout=120)
        assert r.status_code == 200, r.text
    # The hit's line is written before its answer; the miss's after its answer went out: wait for both.
    [miss], [hit] = service.wait_inference_lines(first, again)
    assert miss["cache"] == "miss" and hit["cache"] == "hit"
    assert hit["completion_tokens"] == miss["completion_tokens"] and hit["finish_reason"] == miss["finish_reason"]
    assert hit["queue_wait_s"] == 0 and hit["images"] == 0

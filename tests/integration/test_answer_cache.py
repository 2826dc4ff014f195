"""Identical deterministic requests are answered from the cache, in the same SSE shape; anything else misses."""

from __future__ import annotations

import json

import pytest
import requests

from tests import servers
from tests.integration.conftest import image_message, png_bytes

CHAT = "/v1/chat/completions"


def stream(server, body: dict) -> tuple[str, list[dict]]:
    with requests.post(server.url + CHAT, json={**body, "stream": True}, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith(b"data: ") and line != b"data: [DONE]"]
        return r.headers["X-Cache"], chunks


def text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def strip_ids(chunks: list[dict]) -> list[dict]:
    return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]


def test_repeat_is_a_hit_with_the_same_stream(service):
    body = {"messages": [image_message("Cache me, exactly.")], "max_tokens": 20}
    first_cache, first = stream(service, body)
    again_cache, again = stream(service, body)
    assert (first_cache, again_cache) == ("miss", "hit")
    assert strip_ids(again) == strip_ids(first)  # same chunks, same deltas, same finish_reason
    assert text_of(again) == text_of(first)


@pytest.mark.parametrize("change", ["pixel", "word", "max_tokens"])
def test_any_change_misses(service, change):
    image = png_bytes((64, 64), (10, 20, 30))
    base = {"messages": [image_message("Does one change miss?", image)], "max_tokens": 9}
    stream(service, base)
    if change == "pixel":
        import io

        from PIL import Image

        img = Image.open(io.BytesIO(image))
        img.putpixel((0, 0), (11, 20, 30))
        buf = io.BytesIO()
        img.save(buf, "PNG")
        other = {**base, "messages": [image_message("Does one change miss?", buf.getvalue())]}
    elif change == "word":
        other = {**base, "messages": [image_message("Does one change hit?", image)]}
    else:
        other = {**base, "max_tokens": 10}
    assert stream(service, other)[0] == "miss"
    assert stream(service, base)[0] == "hit"


def test_sampling_without_seed_is_never_cached(service):
    body = {"messages": [image_message("Sample me.")], "max_tokens": 5, "temperature": 0.8}
    assert [stream(service, body)[0] for _ in range(2)] == ["miss", "miss"]
    seeded = {**body, "seed": 7}
    assert [stream(service, seeded)[0] for _ in range(2)] == ["miss", "hit"]


def test_cache_memory_stays_within_bound(tiny_model, tmp_path):
    limit_mb = 0.01  # 10 KiB: a handful of answers
    server = servers.start(tiny_model, tmp_path, VLFLEET_ANSWER_CACHE_MB=str(limit_mb))
    try:
        for i in range(25):
            cache, _ = stream(server, {"messages": [{"role": "user", "content": f"question {i}"}],
                                       "max_tokens": 64, "ignore_eos": True})
            assert cache == "miss"
            metrics = servers.get(server.url + "/metrics")[1]
            used = float(next(line.split()[1] for line in metrics.splitlines()
                              if line.startswith("vlfleet_answer_cache_bytes ")))
            assert 0 < used <= limit_mb * 2**20
        assert stream(server, {"messages": [{"role": "user", "content": "question 24"}], "max_tokens": 64,
                               "ignore_eos": True})[0] == "hit"
        assert stream(server, {"messages": [{"role": "user", "content": "question 0"}], "max_tokens": 64,
                               "ignore_eos": True})[0] == "miss"  # evicted long ago
    finally:
        server.stop()


def test_cache_can_be_turned_off(tiny_model, tmp_path):
    server = servers.start(tiny_model, tmp_path, VLFLEET_ANSWER_CACHE_MB="0")
    try:
        body = {"messages": [{"role": "user", "content": "no cache"}], "max_tokens": 4}
        assert [stream(server, body)[0] for _ in range(2)] == ["miss", "miss"]
    finally:
        server.stop()

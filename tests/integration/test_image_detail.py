"""OpenAI's image_url.detail picks the image's token budget per request, on the API and in the web UI's form:
low < auto < high in prompt tokens for a large image; an unknown detail is a 400 naming the field."""

from __future__ import annotations

import json

import requests

from tests.integration.conftest import data_url, png_bytes

BIG = png_bytes(size=(1200, 800), color=(120, 90, 30))


def _prompt_tokens(service, detail: str | None, seed: int) -> int:
    """The engine's prompt tokens for BIG at ``detail``. The seed (greedy ignores it) keeps the answer cache's key of
    each request its own: the key is of the pixels the model gets, so two details that give the same pixels would
    otherwise compare an answer with the cache's replay of it."""
    image = {"url": data_url(BIG)} | ({"detail": detail} if detail else {})
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": image},
                                                      {"type": "text", "text": "Read the sign."}]}],
            "max_tokens": 1, "seed": seed}
    r = requests.post(service.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["X-Cache"] == "miss", "answered from the answer cache, not counted by the engine"
    return r.json()["usage"]["prompt_tokens"]


def test_detail_picks_the_image_budget_on_the_api(service):
    low, auto, high = (_prompt_tokens(service, d, seed) for seed, d in enumerate(("low", "auto", "high")))
    assert low < auto < high, (low, auto, high)
    assert _prompt_tokens(service, None, 3) == auto


def test_unknown_detail_is_a_400_naming_the_field(service):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(BIG), "detail": "ultra"}},
        {"type": "text", "text": "What is it?"}]}]}
    r = requests.post(service.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0].image_url.detail"


def _form_prompt_tokens(service, detail: str) -> int:
    # Another max_tokens than the API's requests above (the form has no seed): the same image and question at one
    # max_tokens is one answer-cache key whichever endpoint asks, and the form's count must be the engine's.
    r = requests.post(service.url + "/chat", data={"question": "Read the sign.", "max_tokens": "2", "detail": detail},
                      files={"image": ("sign.png", BIG, "image/png")}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["X-Cache"] == "miss", "answered from the answer cache, not counted by the engine"
    done = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and '"finish_reason"'
            in line]
    return done[-1]["timings"]["prompt_tokens"]


def test_detail_picks_the_image_budget_in_the_web_form(service):
    assert _form_prompt_tokens(service, "low") < _form_prompt_tokens(service, "high")

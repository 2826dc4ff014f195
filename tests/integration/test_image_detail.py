"""OpenAI's image_url.detail picks the image's token budget per request, on the API and in the web UI's form:
low < auto < high in prompt tokens for a large image; an unknown detail is a 400 naming the field."""

from __future__ import annotations

import json

import requests

from tests.integration.conftest import data_url, png_bytes

BIG = png_bytes(size=(1200, 800), color=(120, 90, 30))


def _prompt_tokens(service, detail: str | None) -> int:
    image = {"url": data_url(BIG)} | ({"detail": detail} if detail else {})
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": image},
                                                      {"type": "text", "text": "Read the sign."}]}],
            "max_tokens": 1}
    r = requests.post(service.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_detail_picks_the_image_budget_on_the_api(service):
    low, auto, high = (_prompt_tokens(service, d) for d in ("low", "auto", "high"))
    assert low < auto < high, (low, auto, high)
    assert _prompt_tokens(service, None) == auto


def test_unknown_detail_is_a_400_naming_the_field(service):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(BIG), "detail": "ultra"}},
        {"type": "text", "text": "What is it?"}]}]}
    r = requests.post(service.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0].image_url.detail"


def _form_prompt_tokens(service, detail: str) -> int:
    r = requests.post(service.url + "/chat", data={"question": "Read the sign.", "max_tokens": "1", "detail": detail},
                      files={"image": ("sign.png", BIG, "image/png")}, timeout=120)
    assert r.status_code == 200, r.text
    done = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and '"finish_reason"'
            in line]
    return done[-1]["timings"]["prompt_tokens"]


def test_detail_picks_the_image_budget_in_the_web_form(service):
    assert _form_prompt_tokens(service, "low") < _form_prompt_tokens(service, "high")

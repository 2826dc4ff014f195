"""Prompt limits: a prompt over VLFLEET_MAX_INPUT_TOKENS (text and image tokens), _MAX_TURNS or
_MAX_CONVERSATION_IMAGES is a 400 that names the limit and the count, before any inference; the count is the
engine's own (the usage of the same request answered by a server without the limit)."""

from __future__ import annotations

import re

import pytest
import requests

from tests import servers
from tests.integration.conftest import image_message, png_bytes

LIMIT = 40


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    server = servers.start(tiny_model, tmp_path_factory.mktemp("limited"), VLFLEET_MAX_INPUT_TOKENS=str(LIMIT),
                           VLFLEET_MAX_TURNS="3", VLFLEET_MAX_CONVERSATION_IMAGES="2")
    yield server
    server.stop()


def _chat(server, messages: list[dict]) -> requests.Response:
    return requests.post(server.url + "/v1/chat/completions", timeout=120,
                         json={"messages": messages, "max_tokens": 2, "ignore_eos": True})


def _image(size: tuple[int, int]) -> bytes:
    return png_bytes(size=size, color=(30, 60, 200))


@pytest.mark.parametrize("size", [(96, 64), (416, 277), (300, 1000)])
def test_count_in_the_400_equals_the_engines_prompt_tokens(service, limited, size):
    messages = [image_message("What is in this image? " * 3, _image(size))]
    ok = _chat(service, messages)
    assert ok.status_code == 200, ok.text
    engine_count = ok.json()["usage"]["prompt_tokens"]
    assert engine_count > LIMIT, "the probe prompt must be over the limited server's limit"
    refused = _chat(limited, messages)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert re.search(rf"the prompt is {engine_count} tokens .*the limit is {LIMIT} \(VLFLEET_MAX_INPUT_TOKENS\)",
                     error["message"]), (error["message"], engine_count)


def test_refused_before_any_inference(limited):
    before = limited.metric("vlfleet_prompt_tokens_total"), limited.log().count('"msg": "inference"')
    r = _chat(limited, [{"role": "user", "content": "describe every detail " * 200}])
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # nothing reached the pipeline: no prompt tokens counted, no inference logged
    assert (limited.metric("vlfleet_prompt_tokens_total"), limited.log().count('"msg": "inference"')) == before
    short = _chat(limited, [{"role": "user", "content": "Hi."}])
    assert short.status_code == 200, short.text  # the server still answers what fits


def test_turns_and_images_per_conversation(limited):
    turns = []
    for i in range(4):
        turns += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
    r = _chat(limited, turns[:-1])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_turns", r.text
    assert "4 user turns; the limit is 3 (VLFLEET_MAX_TURNS)" in r.json()["error"]["message"]
    small = _image((32, 32))
    three = [image_message("a", small), {"role": "assistant", "content": "b"}, image_message("c", small),
             {"role": "assistant", "content": "d"}, image_message("e", small)]
    r = _chat(limited, three)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images", r.text
    assert "3 images; the limit is 2 (VLFLEET_MAX_CONVERSATION_IMAGES)" in r.json()["error"]["message"]

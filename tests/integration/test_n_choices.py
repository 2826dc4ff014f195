"""n choices and stream_options.include_usage on the real service and the tiny model, every engine, the answer cache
off (every choice is generated: equal greedy choices are not one answer replayed).

A choice is a generation of its own (service.http.choices): at temperature 0 all are the greedy answer; sampled with a
seed, choice i is the answer a single request with seed + i gets, so the choices differ and each can be reproduced.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from openai import OpenAI

from tests.integration.conftest import start_engine
from tests.integration.test_bad_input import chat
from tests.integration.test_logprobs import ENV

MODEL = "qwen3-vl-2b-instruct"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module", params=["direct", "serial", "batching", "llamacpp", "hybrid", "paged"])
def engine(request, tmp_path_factory):
    server = start_engine(request.param, request, tmp_path_factory, **ENV)
    yield request.param, server, OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def create(client: OpenAI, **kwargs):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0,
              "extra_headers": {"X-Request-Id": uuid.uuid4().hex[:16]}, **kwargs}
    return client.chat.completions.create(**kwargs)


def streamed(client: OpenAI, **kwargs) -> tuple[dict[int, str], dict[int, str], list]:
    """Each choice's text and finish reason by index, and the chunks that had no choices (usage)."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    bare = []
    for chunk in create(client, stream=True, **kwargs):
        if not chunk.choices:
            bare.append(chunk)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return texts, finishes, bare


def test_greedy_choices_are_equal_and_indexed(engine):
    _, _, client = engine
    single = create(client)
    out = create(client, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.message.content for c in out.choices] == [single.choices[0].message.content] * 3
    assert out.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    assert out.usage.completion_tokens == 3 * single.usage.completion_tokens
    texts, finishes, _ = streamed(client, n=3)
    assert texts == {i: single.choices[0].message.content for i in range(3)}
    assert set(finishes) == {0, 1, 2}


def test_seeded_choice_i_is_the_answer_of_seed_plus_i(engine):
    _, _, client = engine
    sampled = {"temperature": 1.0, "seed": 77, "max_tokens": 10}
    out = create(client, n=3, **sampled)
    alone = [create(client, **{**sampled, "seed": 77 + i}).choices[0].message.content for i in range(3)]
    assert [c.message.content for c in out.choices] == alone
    assert len(set(alone)) > 1  # different seeds sample different answers (on random weights, near-uniform)


@pytest.mark.parametrize("n", [1, 2])
def test_the_usage_chunk_is_last_and_equals_the_whole_answers_usage(engine, n):
    _, _, client = engine
    whole = create(client, n=n).usage
    chunks = list(create(client, n=n, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1]) and all(c.choices for c in chunks[:-1])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == \
           (whole.prompt_tokens, whole.completion_tokens, whole.total_tokens)
    assert whole.completion_tokens > 0 and whole.prompt_tokens > 0


def test_without_include_usage_no_usage_chunk(engine):
    _, _, client = engine
    _, _, bare = streamed(client, n=2)
    assert bare == []


def test_bad_n_is_a_400_naming_it(engine):
    _, server, _ = engine
    for n in (0, 9, -1, 1.5, "2"):
        status, body = chat(server, {"messages": MESSAGES, "max_tokens": 2, "n": n})
        assert (status, body["error"]["param"]) == (400, "n"), (n, body)


def test_a_client_that_goes_away_cancels_every_choice(engine):
    """Choice 0 is cancelled mid-answer; the choices not read yet never run to their end (queued ones never run)."""
    name, server, _ = engine
    rid = uuid.uuid4().hex[:16]
    body = {"messages": MESSAGES, "max_tokens": 4000, "ignore_eos": True, "n": 3, "stream": True}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=60,
                       headers={"X-Request-Id": rid}) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i >= 6:
                break
    (first,) = server.wait_inference_lines(rid, timeout=60)
    assert first[0]["finish_reason"] == "cancelled"
    # One at a time, choices 1 and 2 were queued: had they not been dropped, they would run (4000 tokens each, their
    # log lines "length") before this request. The batching engine was running them beside choice 0: they end now.
    after = create(client_of(server), max_tokens=2)
    assert after.choices[0].message.content is not None
    others = [f"{rid}.{c}" for c in (1, 2)]
    if name in ("batching", "hybrid", "paged"):  # the engines that run them beside choice 0
        server.wait_inference_lines(*others, timeout=30)
    lines = [line for other in others for line in server.inference_lines(other)]
    assert all(line["finish_reason"] == "cancelled" for line in lines), lines


def client_of(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

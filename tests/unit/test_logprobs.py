"""service.engine.logprobs and service.http.choices without a model: token bytes, log-softmax entries, llama-server's
shape, the engines' refusals, seeds per choice, usage over choices, and answers with logprobs never cached."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service.engine import ENGINES, logprob_engines
from service.engine.answer_cache import cache_key
from service.engine.conversation import Conversation, Sampling, Timings, Turn
from service.engine.errors import APIError
from service.engine.logprobs import TokenBytes, from_llama, from_logits
from service.http.choices import sampling_of, usage
from service.http.openai_request import require_logprobs


@pytest.fixture
def token_bytes(tmp_path):
    # byte-level BPE strings: 'Ġ' is the space, 'Ã©' the two bytes of 'é', 'Ã' one of them alone
    vocab = {"a": 0, "Ġb": 1, "Ã©": 2, "Ã": 3}
    spec = {"model": {"vocab": vocab}, "added_tokens": [{"id": 4, "content": "<|im_end|>"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    return TokenBytes(tmp_path / "tokenizer.json")


def test_token_bytes_undo_the_byte_level_table(token_bytes):
    assert [token_bytes(i) for i in range(6)] == [b"a", b" b", "é".encode(), b"\xc3", b"<|im_end|>", b""]


def test_an_entry_is_the_log_softmax_with_the_top_tokens_in_order(token_bytes):
    logits = np.array([1.0, 3.0, 2.0, -1.0, 0.0], dtype=np.float32)
    e = from_logits(logits, 2, 2, token_bytes)
    logp = logits - np.log(np.exp(logits).sum())
    assert e["logprob"] == pytest.approx(logp[2])
    assert e["bytes"] == list("é".encode()) and e["token"] == "é"
    assert [t["bytes"] for t in e["top_logprobs"]] == [list(b" b"), list("é".encode())]
    assert [t["logprob"] for t in e["top_logprobs"]] == pytest.approx([logp[1], logp[2]])
    assert from_logits(logits, 0, 0, token_bytes)["top_logprobs"] == []
    assert sum(math.exp(t["logprob"]) for t in from_logits(logits, 0, 5, token_bytes)["top_logprobs"]) == \
        pytest.approx(1.0)


def test_a_masked_token_has_no_probability(token_bytes):
    logits = np.array([0.0, -np.finfo(np.float32).max, 1.0, 0.5, 0.2], dtype=np.float32)
    e = from_logits(logits, 2, 5, token_bytes)
    assert e["top_logprobs"][-1]["bytes"] == list(b" b") and e["top_logprobs"][-1]["logprob"] < -1e30


def test_llama_servers_entries_lose_their_ids():
    content = [{"id": 5, "token": "Hi", "bytes": [72, 105], "logprob": -0.5,
                "top_logprobs": [{"id": 5, "token": "Hi", "bytes": [72, 105], "logprob": -0.5}]}]
    assert from_llama(content) == [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                    "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}]
    assert from_llama(None) == []


def test_each_engine_refuses_what_it_cannot_give():
    assert logprob_engines() == ["direct", "batching", "llamacpp", "hybrid", "paged"]
    assert logprob_engines(1) == ["direct", "llamacpp", "hybrid", "paged"]
    asked = Sampling(8, logprobs=True, top_logprobs=3)
    with pytest.raises(APIError) as serial:
        require_logprobs(Sampling(8, logprobs=True), ENGINES["serial"], "serial")
    assert (serial.value.param, serial.value.status) == ("logprobs", 400) and "(serial)" in serial.value.message
    with pytest.raises(APIError) as batching:
        require_logprobs(asked, ENGINES["batching"], "batching")
    assert batching.value.param == "top_logprobs" and "direct, llamacpp" in batching.value.message
    require_logprobs(Sampling(8, logprobs=True), ENGINES["batching"], "batching")  # none of these raise
    require_logprobs(asked, ENGINES["direct"], "direct")
    require_logprobs(Sampling(8), ENGINES["serial"], "serial")


def test_choice_i_samples_with_seed_plus_i():
    seeded = Sampling(8, temperature=1.0, seed=2**63 - 1)
    assert [sampling_of(seeded, i).seed for i in range(3)] == [2**63 - 1, 0, 1]
    assert sampling_of(Sampling(8), 2) == Sampling(8)


def test_usage_counts_the_prompt_once():
    timings = [Timings(prompt_tokens=10, completion_tokens=c) for c in (3, 4)]
    assert usage(timings) == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}


def test_answers_with_logprobs_are_not_cached():
    conv = Conversation((Turn("user", "q"),))
    assert cache_key(conv, Sampling(8), "m") is not None
    assert cache_key(conv, Sampling(8, logprobs=True), "m") is None

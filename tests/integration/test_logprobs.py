"""logprobs / top_logprobs on the real service and the tiny model, every engine, the answer cache off (every answer is
generated, and a test about the engine never reads a replay).

The direct engine's values are checked against the language model itself: the test runs the artifact's OpenVINO
language model over the prompt and each prefix of the answer (a whole prefill per prefix, from an empty state, where
the engine steps one token at a time on its kept KV) and takes the log-softmax of its logits; every step's top token
must be the greedy token the engine chose, and every logprob must match within 1e-3. The other engines' values come
from their runtimes (genai, llama-server): they are checked for what any distribution must satisfy.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests
from openai import BadRequestError, OpenAI

from service.engine.logprobs import TOP_MAX
from tests.integration.conftest import start_engine
from tests.integration.test_bad_input import chat

MODEL = "qwen3-vl-2b-instruct"
QUESTION = "Describe the weather in three words."
# the top_logprobs each engine is asked for (batching: none)
TOP = {"direct": 5, "batching": 0, "llamacpp": 5, "hybrid": 5, "paged": 5}
# The reference below computes in f32 with an f32 KV cache and no dynamic quantisation of activations, so the engine's
# language model must too (the CPU plugin's defaults: bf16 where the CPU has it, a u8 KV cache, int8 activations).
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
ENV = {"VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_PRECISION": "f32", "VLFLEET_KV_PRECISION": "f32",
       "VLFLEET_DQ_GROUP_SIZE": "0", "VLFLEET_MAX_TOKENS": "4096"}


@pytest.fixture(scope="module", params=["direct", "serial", "batching", "llamacpp", "hybrid", "paged"])
def engine(request, tmp_path_factory):
    """(name, service, openai client) of each engine, the answer cache off."""
    server = start_engine(request.param, request, tmp_path_factory, **ENV)
    yield request.param, server, OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def ask(client: OpenAI, stream: bool = False, **kwargs):
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8,
              "temperature": 0, "extra_headers": {"X-Request-Id": uuid.uuid4().hex[:16]}, **kwargs}
    return client.chat.completions.create(stream=stream, **kwargs)


def whole(client: OpenAI, **kwargs) -> tuple[str, list, int]:
    out = ask(client, **kwargs)
    choice = out.choices[0]
    return choice.message.content, choice.logprobs.content, out.usage.completion_tokens


def streamed(client: OpenAI, **kwargs) -> tuple[str, list, list[tuple[str, list]]]:
    """The text, every token's entry, and each chunk's (delta text, entries)."""
    chunks = []
    for chunk in ask(client, stream=True, **kwargs):
        for choice in chunk.choices:
            entries = choice.logprobs.content if choice.logprobs else []
            chunks.append((choice.delta.content or "", entries or []))
    return "".join(t for t, _ in chunks), [e for _, es in chunks for e in es], chunks


def joined(entries) -> str:
    return b"".join(bytes(e.bytes) for e in entries).decode()


def check_distribution(entries, top: int, greedy: bool) -> None:
    for e in entries:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == top
        assert all(t.logprob <= 0 for t in e.top_logprobs)
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-4
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        if greedy and top:  # at temperature 0 the chosen token is the most likely one (or tied with it)
            assert e.bytes in [t.bytes for t in e.top_logprobs]
            assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4)


# serial refuses logprobs (test_serial_refuses_logprobs_naming_the_engines_that_can)
@pytest.mark.parametrize("engine", ["direct", "batching", "llamacpp", "hybrid", "paged"], indirect=True)
def test_logprobs_of_a_whole_and_a_streamed_answer(engine):
    name, _, client = engine
    top = TOP[name]
    text, entries, completion = whole(client, logprobs=True, top_logprobs=top)
    assert entries and len(entries) == completion  # one entry per generated token
    assert joined(entries) == text  # the tokens' bytes are the answer
    check_distribution(entries, top, greedy=True)
    s_text, s_entries, chunks = streamed(client, logprobs=True, top_logprobs=top)
    assert s_text == text  # greedy: the same answer, streamed
    assert [e.bytes for e in s_entries] == [e.bytes for e in entries]
    # within f32 rounding: a repeated prompt's last token is computed on the kept KV, not in the whole prefill
    assert [e.logprob for e in s_entries] == pytest.approx([e.logprob for e in entries], abs=1e-3)
    if name != "llamacpp":  # each chunk carries the tokens of its delta (llama-server chunks its own way)
        assert all(joined(es) == t for t, es in chunks if es)


ENTRY, TOP_ENTRY = {"token", "logprob", "bytes", "top_logprobs"}, {"token", "logprob", "bytes"}


@pytest.mark.parametrize("engine", ["direct", "batching", "llamacpp", "hybrid", "paged"], indirect=True)
def test_the_raw_json_has_openais_shape(engine):
    """The wire format itself, as a client without the SDK reads it: whole and streamed."""
    name, server, _ = engine
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 6, "logprobs": True,
            "top_logprobs": TOP[name]}
    status, out = chat(server, body)
    assert status == 200, out
    content = out["choices"][0]["logprobs"]["content"]
    assert content and all(set(e) == ENTRY and all(set(t) == TOP_ENTRY for t in e["top_logprobs"]) for e in content)
    assert all(isinstance(e["token"], str) and all(0 <= b < 256 for b in e["bytes"]) for e in content)
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: {")]
    streamed_entries = []
    for chunk in chunks:
        (choice,) = chunk["choices"]
        if choice["delta"].get("content"):  # a chunk with text carries its tokens' logprobs
            assert set(choice["logprobs"]) >= {"content"}
        streamed_entries += (choice.get("logprobs") or {}).get("content") or []
    assert all(set(e) == ENTRY for e in streamed_entries)
    assert [e["bytes"] for e in streamed_entries] == [e["bytes"] for e in content]


def test_logprobs_are_left_out_unless_asked(engine):
    client = engine[2]
    out = ask(client)
    assert out.choices[0].logprobs is None
    for chunk in ask(client, stream=True):
        assert all(c.logprobs is None for c in chunk.choices)


def test_the_top_logprobs_bound_and_logprobs_are_required(engine):
    _, server, _ = engine
    base = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2}
    for extra, param in [({"logprobs": True, "top_logprobs": TOP_MAX + 1}, "top_logprobs"),
                         ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 1}, "logprobs"),
                         ({"n": 0}, "n")]:
        status, body = chat(server, {**base, **extra})
        assert (status, body["error"]["param"]) == (400, param), (extra, body)


@pytest.mark.parametrize("engine", ["serial", "batching"], indirect=True)
def test_serial_refuses_logprobs_naming_the_engines_that_can(engine):
    name, _, client = engine
    kwargs = {"logprobs": True} if name == "serial" else {"logprobs": True, "top_logprobs": 1}
    with pytest.raises(BadRequestError) as refused:
        ask(client, **kwargs)
    error = refused.value.body
    assert error["param"] == ("logprobs" if name == "serial" else "top_logprobs")
    assert f"({name})" in error["message"] and "direct" in error["message"] and "llamacpp" in error["message"]


# --- the direct engine against its language model -------------------------------------------------------------


def gpt2_bytes() -> dict[str, int]:
    """Byte-level BPE's printable character -> byte (GPT-2's table), to read tokenizer.json's vocabulary."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {chr(b): b for b in keep}
    table.update({chr(256 + i): b for i, b in enumerate(b for b in range(256) if b not in keep)})
    return table


def token_ids(model: Path) -> dict[bytes, int]:
    spec = json.loads((model / "tokenizer.json").read_text())
    to_byte = gpt2_bytes()
    ids = {bytes(to_byte[c] for c in s): i for s, i in spec["model"]["vocab"].items()}
    ids.update({t["content"].encode(): t["id"] for t in spec["added_tokens"]})
    return ids


class Reference:
    """The artifact's language model run over a whole token sequence from an empty state: the next token's logits."""

    def __init__(self, model: Path):
        import openvino as ov

        core = ov.Core()
        lm = core.read_model(str(model / "openvino_language_model.xml"))
        layers = lm.input("deepstack_visual_embeds").get_partial_shape()[0]
        self.layers = 0 if layers.is_dynamic else layers.get_length()
        self.hidden = lm.input("inputs_embeds").get_partial_shape()[2].get_length()
        self.lm = core.compile_model(lm, "CPU", EXACT).create_infer_request()
        self.embed = core.compile_model(str(model / "openvino_text_embeddings_model.xml"), "CPU",
                                        EXACT).create_infer_request()

    def log_softmax(self, ids: list[int]) -> np.ndarray:
        n = len(ids)
        embeds = self.embed.infer({"input": np.array([ids], dtype=np.int64)})[0]
        self.lm.reset_state()
        out = self.lm.infer({"inputs_embeds": embeds, "attention_mask": np.ones((1, n), dtype=np.int64),
                             "position_ids": np.tile(np.arange(n, dtype=np.int64), (3, 1, 1)),
                             "visual_pos_masks": np.zeros((1, n), bool),
                             "deepstack_visual_embeds": np.zeros((self.layers, n, self.hidden), np.float32),
                             "beam_idx": np.zeros(1, dtype=np.int32)})
        z = np.array(out["logits"][0, -1], dtype=np.float64)
        return z - z.max() - np.log(np.exp(z - z.max()).sum())


def prompt_ids(model: Path) -> list[int]:
    import openvino_genai as ov_genai

    tokenizer = ov_genai.Tokenizer(str(model))
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]


@pytest.mark.parametrize("engine", ["direct"], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_direct_logprobs_are_the_log_softmax_of_the_language_model(engine, tiny_model, stream):
    client = engine[2]
    kwargs = {"logprobs": True, "top_logprobs": 5, "max_tokens": 10}
    entries = streamed(client, **kwargs)[1] if stream else whole(client, **kwargs)[1]
    assert len(entries) >= 2
    ids, reference = token_ids(tiny_model), Reference(tiny_model)
    sequence = prompt_ids(tiny_model)
    for step, e in enumerate(entries):
        logp = reference.log_softmax(sequence)
        chosen = ids[bytes(e.bytes)]
        assert chosen == int(np.argmax(logp)), f"step {step}: not the greedy token"
        assert e.logprob == pytest.approx(logp[chosen], abs=1e-3), f"step {step}"
        best = np.argsort(-logp, kind="stable")[:5]
        assert [ids[bytes(t.bytes)] for t in e.top_logprobs] == best.tolist(), f"step {step}"
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(logp[best].tolist(), abs=1e-3)
        sequence.append(chosen)


@pytest.mark.parametrize("engine", ["direct", "llamacpp"], indirect=True)
def test_constrained_answers_give_the_logprobs_of_the_masked_distribution(engine):
    """With a response_format the tokens the grammar forbids have no probability: the entries renormalise over the
    allowed ones (direct), and the tokens are still the answer."""
    name, _, client = engine
    text, entries, _ = whole(client, logprobs=True, top_logprobs=5, max_tokens=40, temperature=1.0, seed=5,
                             response_format={"type": "json_object"})
    tokens = joined(entries)
    if name == "llamacpp":  # llama-server trims the whitespace a JSON answer starts with from its content, not its
        text = tokens[:len(tokens) - len(tokens.lstrip())] + text  # tokens (measured: tokens ' {}', content '{}')
    assert tokens == text
    check_distribution(entries, 5, greedy=False)
    if name == "direct" and text.endswith("}"):
        json.loads(text)

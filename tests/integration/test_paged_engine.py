"""The paged engine (VLFLEET_ENGINE=paged) on the tiny model: the artifact's OpenVINO language model over a paged KV
cache, several conversations per decode step. Its logits equal the direct engine's, a batched step gives each
conversation its own logits, a follow-up runs the vision encoder 0 times, two conversations keep their own KV, and
concurrent answers share decode steps. The answer cache is off: every answer here comes from the engine."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
from openai import OpenAI

from service.engine.conversation import Conversation, Turn
from tests.integration.conftest import image_message, png_bytes, start_engine
from tests.integration.test_direct_engine import _ask
from tests.integration.test_hybrid_engine import REUSED, RUNS, _conversation, _follow_up

MODEL = "qwen3-vl-2b-instruct"
ENV = {"VLFLEET_ANSWER_CACHE_MB": "0"}
# The same IR, both sides in f32 with an f32 KV cache: what differs is the attention kernel (paged against the
# stateful model's) and the order of its sums. Measured on the tiny model: 4e-7 of the largest logit.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def paged(request, tmp_path_factory):
    server = start_engine("paged", request, tmp_path_factory, **ENV)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(paged):
    return OpenAI(base_url=paged.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_follow_up_runs_the_vision_encoder_zero_times(paged, client):
    first = [image_message("What is in this image?", png_bytes((120, 90), (20, 160, 60)))]
    runs0 = paged.metric(RUNS)
    answer = _ask(client, first)
    assert paged.metric(RUNS) == runs0 + 1
    reused0 = paged.metric(REUSED)
    assert _ask(client, _follow_up(first, answer, "And its colour?")).choices[0].message.content is not None
    assert paged.metric(RUNS) == runs0 + 1  # the re-sent image was kept
    assert paged.metric(REUSED) - reused0 >= answer.usage.prompt_tokens  # the first turn came from the KV


def test_two_conversations_asking_follow_ups_at_once_each_keep_their_kv(paged, client):
    firsts = [[image_message(q, png_bytes((100, 80), c))]
              for q, c in (("Describe it.", (200, 30, 30)), ("What shape is it?", (30, 30, 200)))]
    answers = [_ask(client, f) for f in firsts]
    reused0 = paged.metric(REUSED)
    results: list = [None, None]

    def follow(i: int) -> None:
        results[i] = _ask(client, _follow_up(firsts[i], answers[i], "Why?"))

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r is not None for r in results)
    assert paged.metric(REUSED) - reused0 >= sum(a.usage.prompt_tokens for a in answers)


def test_concurrent_answers_share_decode_steps(paged, client):
    ids, results = [f"paged-{i}" for i in range(3)], [None] * 3

    def ask(i: int) -> None:
        results[i] = client.chat.completions.create(
            model=MODEL, messages=[image_message(f"Question {i}?", png_bytes((64 + 8 * i, 64), (9, 99, 9 * i)))],
            max_tokens=48, temperature=0, extra_body={"ignore_eos": True}, extra_headers={"X-Request-Id": ids[i]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r is not None and r.usage.completion_tokens == 48 for r in results), results
    lines = [lines[-1] for lines in paged.wait_inference_lines(*ids)]
    assert max(line["decode_batch_max"] for line in lines) >= 2, lines


# --- the logits, in process ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp16_ir(tiny_checkpoint):
    from ops.model import cache, convert

    return cache.artifact("tiny", convert.ConvertParams("fp16"))


def _settings(ir, **overrides) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{
        "model_dir": ir, "device": "CPU", "threads": 0, "precision": "f32", "lm_precision": "f32",
        "dq_group_size": "0", "kv_precision": "f32", "model_cache_dir": None, "image_cache_mb": 64, "kv_cache_gb": 1,
        "max_input_tokens": 4096, "max_tokens": 64, "log_level": "info", **overrides})


def _close(a, b) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE * float(np.abs(b).max()))


def test_logits_equal_the_direct_engines(fp16_ir):
    """Prefill (text, image embeddings with their deepstack features, M-RoPE positions), decode steps, and a
    follow-up continued from the kept KV: the last position's logits equal the direct engine's (StatefulLM)."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.paged_lm import PagedLM

    settings = _settings(fp16_ir)
    direct, paged = DirectPipeline(settings), DirectPipeline(settings, language_model=PagedLM)
    first = _conversation("Describe this image.", (150, 100))
    follow = Conversation((*first.turns, Turn("assistant", "a picture"), Turn("user", "Which colour?")))
    for conv in (first, follow):
        prompts = [p.prompt(conv, Generation()) for p in (direct, paged)]
        (want, _), (got, kept) = direct.lm.prefill(prompts[0]), paged.lm.prefill(prompts[1])
        assert (kept > 0) == (conv is follow)
        _close(got, want)
        for i, token in enumerate((11, 12, 13)):
            at = prompts[0].next_position + i
            _close(paged.lm.step(token, at), direct.lm.step(token, at))


@pytest.mark.parametrize("chunk", [5, 1000])
def test_a_batched_step_gives_each_sequence_its_own_logits(fp16_ir, chunk):
    """Three conversations, their prompts fed in chunks (5 tokens: chunks that start and end inside an image) or
    whole, stepped together and then each alone from the same state: the same logits, each its own. A prompt with an
    answer longer than the cache is not given a sequence, and conversations forgotten give their blocks back."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.paged_lm import PagedLM

    pipe = DirectPipeline(_settings(fp16_ir), language_model=PagedLM)
    lm, free = pipe.lm, len(pipe.lm._free)
    asked = (("Describe this image.", (110, 70)), ("What colour is it?", (70, 110)), ("Is it dark?", (90, 90)))
    prompts = [pipe.prompt(_conversation(q, side), Generation()) for q, side in asked]
    seqs, whole = [], []
    for prompt in prompts:
        s, keep = lm.claim(prompt, 8)
        *_, logits = lm.feed(s, prompt, keep, chunk)
        seqs.append((s, int(np.argmax(logits)), prompt.next_position))
        whole.append(logits)
    reference = DirectPipeline(_settings(fp16_ir))
    for prompt, logits in zip(prompts, whole, strict=True):
        _close(logits, reference.lm.prefill(prompt)[0])  # chunked or not, the prompt's logits
    together = lm.step_many(seqs)
    assert not np.allclose(together[0], together[1])
    for i, (s, token, position) in enumerate(seqs):
        lm._cut(s, len(s.keys) - 1)
        _close(together[i], lm.step_many([(s, token, position)])[0])
    assert lm.claim(prompts[0], lm.n_ctx) is None
    for s, _, _ in seqs:
        lm.forget(s)
    assert len(lm._free) == free

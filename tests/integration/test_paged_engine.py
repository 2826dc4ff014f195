"""The paged engine (VLFLEET_ENGINE=paged) on the tiny model: the artifact's OpenVINO language model over a paged KV
cache, several conversations per decode step (the direct engine's language model too, one conversation at a time).
Its logits equal the stateful model's, a batched step gives each conversation its own logits (a prompt chunk in the
same call too), a follow-up runs the vision encoder 0 times, two conversations keep their own KV, and concurrent
answers share decode steps; a prompt the cache cannot hold is a 400. The answer cache is off: every answer here
comes from the engine."""

from __future__ import annotations

import types

import numpy as np
import pytest
from openai import OpenAI

from service.engine.conversation import Conversation, Turn
from tests.integration.conftest import start_engine
from tests.integration.test_hybrid_engine import (  # the hybrid engine's HTTP checks, run here on this module's server
    ENV,
    _conversation,
    test_a_follow_up_runs_the_vision_encoder_zero_times,  # noqa: F401
    test_a_request_starts_once_the_one_before_has_its_first_token,  # noqa: F401
    test_concurrent_answers_share_decode_steps,  # noqa: F401
    test_two_conversations_taking_turns_each_keep_their_kv,  # noqa: F401
)

# The same IR, both sides in f32 with an f32 KV cache: what differs is the attention kernel (paged against the
# stateful model's SDPA, tests/integration/stateful_reference.py) and the order of its sums. Measured on the tiny
# model: 4e-7 of the largest logit.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    server = start_engine("paged", request, tmp_path_factory, **ENV)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


# --- the logits, in process ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp16_ir(tiny_checkpoint):
    from ops.model import cache, convert

    return cache.artifact("tiny", convert.ConvertParams("fp16"))


def _settings(ir, **overrides) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{
        "model_dir": ir, "device": "CPU", "threads": 0, "precision": "f32", "lm_precision": "f32",
        "dq_group_size": "0", "kv_precision": "f32", "model_cache_dir": None, "image_cache_mb": 64,
        "vision_weights": "compressed", "kv_cache_gb": 1,
        "max_input_tokens": 4096, "max_tokens": 64, "log_level": "info", **overrides})


def _stateful(settings, model_dir):
    """The artifact's language model in its exported stateful form: the reference here."""
    import openvino as ov

    from service.engine.genai import split_properties
    from tests.integration.stateful_reference import StatefulLM

    return StatefulLM(ov.Core(), model_dir, settings.device, split_properties(settings)[1])


def _close(a, b) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE * float(np.abs(b).max()))


def test_logits_equal_the_stateful_models(fp16_ir):
    """Prefill (text, image embeddings with their deepstack features, M-RoPE positions), decode steps, and a
    follow-up continued from the kept KV: the last position's logits equal the stateful model's."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.paged_lm import PagedLM

    settings = _settings(fp16_ir)
    direct, paged = DirectPipeline(settings, language_model=_stateful), DirectPipeline(settings, language_model=PagedLM)
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
    reference = DirectPipeline(_settings(fp16_ir), language_model=_stateful)
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


def test_a_prompt_chunk_and_a_decode_step_in_one_call_give_each_its_own_logits(fp16_ir):
    """The paged engine's turn (service.engine.paged): a new prompt fed 7 tokens at a time (chunks that start and
    end inside its image), each call also stepping two other conversations, gives the prompt the stateful model's
    logits and each step the logits it gets in a call of its own."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.paged_lm import PagedLM

    pipe = DirectPipeline(_settings(fp16_ir), language_model=PagedLM)
    lm = pipe.lm
    asked = (("Describe this image.", (110, 70)), ("What colour is it?", (70, 110)), ("Is it dark?", (90, 90)))
    first, second, new = (pipe.prompt(_conversation(q, side), Generation()) for q, side in asked)
    steps = []
    for prompt in (first, second):
        s, keep = lm.claim(prompt, 64)
        *_, logits = lm.feed(s, prompt, keep, 1000)
        steps.append((s, int(np.argmax(logits)), prompt.next_position))
    filling, keep = lm.claim(new, 8)
    for a in range(keep, len(new.ids), 7):
        last, logits = lm.feed_beside(filling, new, a, min(a + 7, len(new.ids)), steps)
        done, steps = steps, [(s, int(np.argmax(row)), at + 1) for (s, _, at), row in zip(steps, logits, strict=True)]
    reference = DirectPipeline(_settings(fp16_ir), language_model=_stateful)
    _close(last, reference.lm.prefill(new)[0])
    assert not np.allclose(logits[0], logits[1])
    for (s, token, at), row in zip(done, logits, strict=True):  # the last call's steps, again each alone
        lm._cut(s, len(s.keys) - 1)
        _close(row, lm.step_many([(s, token, at)])[0])


def test_a_prompt_the_cache_cannot_hold_is_a_400_naming_the_setting(fp16_ir):
    """One conversation at a time (the direct engine): a prompt longer than the cache holds is the client's 400
    naming VLFLEET_KV_CACHE_GB, before any of it is computed, and the next prompt that fits is answered."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.errors import APIError

    pipe = DirectPipeline(_settings(fp16_ir))
    prompt = pipe.prompt(_conversation("Describe this image.", (150, 100)), Generation())
    pipe.lm.n_ctx = len(prompt.ids) - 1  # as if VLFLEET_KV_CACHE_GB held one token fewer
    with pytest.raises(APIError) as raised:
        pipe.lm.prefill(prompt)
    error = raised.value
    assert (error.status, error.code) == (400, "context_length_exceeded")
    assert "VLFLEET_KV_CACHE_GB" in error.message and str(len(prompt.ids)) in error.message
    assert pipe.lm.keys == [] and len(pipe.lm._free) == pipe.lm.n_blocks
    pipe.lm.n_ctx = len(prompt.ids)
    logits, kept = pipe.lm.prefill(prompt)
    assert kept == 0 and logits.shape == (pipe.lm.vocab_size,)


def test_the_bench_times_a_step_of_each_size_through_the_engines_language_model(fp16_ir):
    """ops.bench.paged_steps, in its own interpreter as the bench runs it: a row per step size the engine takes; a
    model it cannot load is a failure that says so, not a hang or a traceback in the bench."""
    from ops.bench import paged_steps
    from service.engine.paged_lm import PagedLM

    result = paged_steps.run_subprocess(fp16_ir)
    assert [r["sequences"] for r in result["rows"]] == list(range(1, PagedLM.sequences + 1))
    assert all(r["ms_per_step"] > 0 for r in result["rows"]), result
    fused = result["fused"]
    assert fused["others"] == paged_steps.FUSED_OTHERS
    assert min(fused["chunk_ms"], fused["step_ms"], fused["together_ms"]) > 0, fused
    with pytest.raises(RuntimeError, match="paged decode steps failed"):
        paged_steps.run_subprocess(fp16_ir / "missing")

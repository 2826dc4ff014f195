"""The hybrid engine (VLFLEET_ENGINE=hybrid) on the tiny model: OpenVINO's vision tower in front of llama.cpp's
language model. Its logits equal the direct engine's, a follow-up runs the vision encoder 0 times, two
conversations taking turns each keep their KV, and a crashed llama.cpp process fails one request, not the service.
The answer cache is off: every answer here comes from the engine."""

from __future__ import annotations

import datetime
import itertools
import signal
import struct
import threading
import types
import urllib.error

import numpy as np
import psutil
import pytest
from openai import OpenAI

from service.engine.conversation import Conversation, Turn
from service.engine.images import PreparedImage
from tests import servers
from tests.integration.conftest import image_message, png_bytes, start_engine
from tests.integration.test_response_format import post

RUNS, REUSED = "vlfleet_vision_encoder_runs_total", "vlfleet_reused_prompt_tokens_total"
MODEL = "qwen3-vl-2b-instruct"
# The answer cache off, and room for an answer that outlasts the others (test_concurrent_answers_share_decode_steps).
OUTLASTING_TOKENS = 4000
ENV = {"VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_MAX_TOKENS": str(OUTLASTING_TOKENS)}
LOG_SLACK_S = 0.01  # the log's time is to the millisecond and taken a little after the answer's end
# fp16 weights on both sides (the IR's and the GGUF's), f32 arithmetic: what differs is llama.cpp's kernels
# (activations rounded to f16 for its f16 matmuls). Measured on the tiny model: 6e-4 of the largest logit.
TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    server = start_engine("hybrid", request, tmp_path_factory, **ENV)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client, messages, max_tokens=6, request_id=None):
    headers = {"X-Request-Id": request_id} if request_id else None
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_headers=headers)


def _follow_up(first: list[dict], answer, question: str) -> list[dict]:
    return [*first, {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": question}]


def test_a_follow_up_runs_the_vision_encoder_zero_times(server, client):
    """The first prompt is computed by OpenVINO (the default VLFLEET_HYBRID_PREFILL) and its KV handed to llama.cpp;
    the follow-up continues from that KV on llama.cpp, its image kept."""
    first = [image_message("What is in this image?", png_bytes((120, 90), (20, 160, 60)))]
    runs0 = server.metric(RUNS)
    answer = _ask(client, first, request_id="first")
    assert server.metric(RUNS) == runs0 + 1
    reused0 = server.metric(REUSED)
    follow = _ask(client, _follow_up(first, answer, "And its colour?"), request_id="follow")
    assert follow.choices[0].message.content is not None
    assert server.metric(RUNS) == runs0 + 1  # the re-sent image was kept
    assert server.metric(REUSED) - reused0 >= answer.usage.prompt_tokens  # the first turn came from the KV
    lines = [lines[-1] for lines in server.wait_inference_lines("first", "follow")]
    engine = servers.get(server.url + "/readyz")[1]["engine"]  # the paged engine's module runs this test too
    follow_on = "llamacpp" if engine == "hybrid" else "openvino"
    assert [line["prefill_on"] for line in lines] == ["openvino", follow_on], lines


def test_two_conversations_taking_turns_each_keep_their_kv(server, client):
    """A, B, then both follow-ups at once: each follow-up finds its own conversation in its own sequence (one KV
    state, as the direct engine has, would have been cut back to the chat template for one)."""
    firsts = [[image_message(q, png_bytes((100, 80), c))]
              for q, c in (("Describe it.", (200, 30, 30)), ("What shape is it?", (30, 30, 200)))]
    answers = [_ask(client, f) for f in firsts]
    reused0 = server.metric(REUSED)
    results: list = [None, None]

    def follow(i: int) -> None:
        results[i] = _ask(client, _follow_up(firsts[i], answers[i], "Why?"))

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r is not None for r in results)
    assert server.metric(REUSED) - reused0 >= sum(a.usage.prompt_tokens for a in answers)


def test_a_crashed_language_model_fails_one_request_and_the_next_is_served(server, client):
    workers = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
               if "service.engine.llama_worker" in " ".join(p.cmdline())]
    assert len(workers) == 1, workers
    workers[0].send_signal(signal.SIGKILL)  # a process this test's service started
    # the service reaps it when it next speaks to it: until then it is a zombie
    servers.wait_for(lambda: not workers[0].is_running() or workers[0].status() == psutil.STATUS_ZOMBIE,
                     timeout=10, what="the killed worker to end")
    question = [image_message("What is this?", png_bytes((64, 64), (5, 5, 5)))]
    status, body = post(server, {"model": MODEL, "messages": question, "max_tokens": 4})
    assert status >= 500 and "SIGKILL" in body["error"]["message"], body
    assert _ask(client, question).choices[0].message.content is not None
    status, ready = servers.get(server.url + "/readyz")
    assert status == 200, ready


def test_a_missing_interface_library_is_named_at_start(request, tmp_path_factory):
    server = start_engine("hybrid", request, tmp_path_factory, wait=False, VLFLEET_LLAMACPP_LIB="/nonexistent.so")
    def failed() -> dict | None:
        try:
            status, body = servers.get(server.url + "/readyz")
        except urllib.error.URLError:  # not listening yet
            return None
        return body if status == 503 and body.get("failed") else None

    try:
        servers.wait_for(failed, timeout=60, what="/readyz to say it failed")
        body = failed()
        assert "libvlfleet_llama.so" in body["reason"] and "VLFLEET_LLAMACPP_LIB" in body["reason"], body
    finally:
        server.stop()


# --- the logits, in process ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp16_pair(tiny_checkpoint, llama_server, llama_lib):
    """The tiny checkpoint as an fp16 IR and as an F16 GGUF: the same weights on both sides."""
    from ops.llamacpp import build, gguf
    from ops.model import cache, convert

    return (cache.artifact("tiny", convert.ConvertParams("fp16")),
            gguf.cached("tiny", gguf.GgufParams(quant="F16"), build_config=build.test_config()), llama_lib)


def _settings(ir, gguf, lib, prefill: str = "llamacpp") -> types.SimpleNamespace:
    return types.SimpleNamespace(model_dir=ir, device="CPU", threads=0, precision="f32", lm_precision="f32",
                                 dq_group_size="0", kv_precision="auto", model_cache_dir=None, image_cache_mb=64,
                                 vision_weights="compressed", llamacpp_model_dir=gguf, llamacpp_lib=lib,
                                 llamacpp_ctx=0, max_input_tokens=4096, max_tokens=64, log_level="info",
                                 hybrid_prefill=prefill, kv_cache_gb=1)


def _conversation(question: str, side=(110, 70)) -> Conversation:
    pixels = np.random.default_rng(0).integers(0, 255, (1, side[1], side[0], 3), dtype=np.uint8)
    return Conversation((Turn("user", question, (PreparedImage(pixels, "img", side),)),))


@pytest.mark.parametrize("prefill", ["llamacpp", "openvino"])
def test_logits_equal_the_direct_engines(fp16_pair, prefill):
    """Prefill (text, image embeddings with their deepstack features, M-RoPE positions), decode steps, and a
    follow-up continued from the kept KV: the last position's logits equal the direct engine's on the same
    weights, within TOLERANCE of the largest logit. With the prompt computed by OpenVINO, the decode steps run on
    the KV it handed to llama.cpp (service.engine.kv_handoff)."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.llama_lm import LlamaLM

    settings = _settings(*fp16_pair, prefill)
    direct, hybrid = DirectPipeline(settings), DirectPipeline(settings, language_model=LlamaLM)
    first = _conversation("Describe this image.", (150, 100))
    follow = Conversation((*first.turns, Turn("assistant", "a picture"), Turn("user", "Which colour?")))
    for conv in (first, follow):
        prompts = [p.prompt(conv, Generation()) for p in (direct, hybrid)]
        (want, _), (got, kept) = direct.lm.prefill(prompts[0]), hybrid.lm.prefill(prompts[1])
        assert (kept > 0) == (conv is follow)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE * float(np.abs(want).max()))
        for i, token in enumerate((11, 12, 13)):
            at = prompts[0].next_position + i
            want, got = direct.lm.step(token, at), hybrid.lm.step(token, at)
            np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE * float(np.abs(want).max()))
    hybrid.lm.close()


def test_concurrent_answers_share_decode_steps(server, client):
    """Two clients ask while a third client's answer is streaming: their decode steps run in its batch (the inference
    log's decode_batch_max), and each answer is whole. The streamed answer could outlast theirs many times over and is
    cancelled once they end, so the overlap holds however fast the machine decodes (three requests started together
    can each end before the next one is even parsed on a fast CPU)."""
    ids = [f"batch-{i}" for i in range(2)]
    with client.chat.completions.create(
            model=MODEL, messages=[image_message("Tell a long story.", png_bytes((56, 64), (9, 99, 90)))],
            max_tokens=OUTLASTING_TOKENS, temperature=0, stream=True, extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "batch-long"}) as stream:
        next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)  # it is decoding
        results = _at_once(client, ids, [(f"Question {i}?", png_bytes((64 + 8 * i, 64), (9, 99, 9 * i)))
                                         for i in range(2)], max_tokens=48)
    assert all(r is not None and r.usage.completion_tokens == 48 for r in results), results
    lines = [lines[-1] for lines in server.wait_inference_lines(*ids)]
    assert all(line["decode_batch_max"] >= 2 for line in lines), lines


def test_a_request_starts_once_the_one_before_has_its_first_token(server, client):
    """Three clients at once: a request is started (its images encoded, its prompt computed) only once the one
    started before it has computed its prompt (and drawn its first token from it), so the first answers do not wait
    for the others' images. From the inference log: its time is the answer's end, ``total_s`` and ``prompt_s`` are
    from the answer's start."""
    ids = [f"order-{i}" for i in range(3)]
    question = "Describe every part of this picture. " * 120  # a prompt whose prefill takes a while, even here
    _at_once(client, ids, [(f"{i}. {question}", png_bytes((160, 120), (9 * i, 99, 9))) for i in range(3)], max_tokens=8)
    lines = [lines[-1] for lines in server.wait_inference_lines(*ids)]
    starts = sorted((_logged_at(line) - line["total_s"], line["prompt_s"]) for line in lines)
    for (start, prompt_s), (next_start, _) in itertools.pairwise(starts):
        assert next_start >= start + prompt_s - LOG_SLACK_S, lines


def _at_once(client, ids: list[str], asked: list[tuple[str, bytes]], max_tokens: int) -> list:
    """Each (question, image) asked by a client of its own, all started together; their completions (None for one
    that did not end)."""
    results = [None] * len(ids)

    def ask(i: int) -> None:
        question, png = asked[i]
        results[i] = client.chat.completions.create(
            model=MODEL, messages=[image_message(question, png)], max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True}, extra_headers={"X-Request-Id": ids[i]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def _logged_at(line: dict) -> float:
    return datetime.datetime.fromisoformat(line["ts"].replace("Z", "+00:00")).timestamp()


def test_a_prompt_that_cannot_fit_the_context_is_a_400(request, tmp_path_factory):
    # llama.cpp rounds a context up (to 256 tokens here): a longest answer of 1000 tokens cannot fit it
    server = start_engine("hybrid", request, tmp_path_factory, **{**ENV, "VLFLEET_LLAMACPP_CTX": "64",
                                                                      "VLFLEET_MAX_TOKENS": "1000"})
    try:
        status, body = post(server, {
            "model": MODEL, "messages": [image_message("What is this?", png_bytes((64, 64)))], "max_tokens": 1000})
    finally:
        server.stop()
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "VLFLEET_LLAMACPP_CTX" in body["error"]["message"]


@pytest.mark.parametrize("conversations", [2, 3])
def test_a_batched_step_gives_each_sequence_its_own_logits(fp16_pair, conversations):
    """Conversations in their own sequences, stepped together in one batch and then each alone from the same
    state: the same logits (within TOLERANCE), each its own. Three also take the padded step (a fourth row in the
    spare sequence, vlfleet_llama.c; the bench's comparison), which must change none of them beyond TOLERANCE and
    leave nothing behind: twice over."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.llama_lm import LlamaLM

    pipe = DirectPipeline(_settings(*fp16_pair), language_model=LlamaLM)
    lm = pipe.lm
    asked = (("Describe this image.", (110, 70)), ("What colour is it?", (70, 110)), ("Is it dark?", (90, 90)))
    prompts = [pipe.prompt(_conversation(q, side), Generation()) for q, side in asked[:conversations]]
    seqs = []
    for prompt in prompts:
        s, keep = lm.claim(prompt, 8)
        *_, logits = lm.feed(s, prompt, keep, 16)
        seqs.append((s, int(np.argmax(logits)), prompt.next_position))
    for _ in range(2):
        together = lm.step_many(seqs, pad=conversations == 3)
        assert not np.allclose(together[0], together[1])
        for (s, token, at), want in zip(seqs, together, strict=True):
            lm._cut(s, len(s.keys) - 1)  # back to before the batched step
            alone = lm.step_many([(s, token, at)])[0]
            np.testing.assert_allclose(alone, want, rtol=0, atol=TOLERANCE * float(np.abs(want).max()))
        seqs = [(s, int(np.argmax(row)), at + 1) for (s, _, at), row in zip(seqs, together, strict=True)]
    lm.close()


def test_a_sequence_continued_where_its_cells_lie_otherwise_gets_the_same_logits(fp16_pair):
    """The same prompt in three sequences, fed and stepped as the engine's loop runs them (one chunk of a prompt, then
    a decode step for the others), released, then asked again: each is cut back and continued in cells the cache now
    lays out otherwise (its answer's cells freed between the others'). Every first token's logits are the first
    answer's (within 1e-5 of the largest: what differs is the order of f32 sums). With llama.cpp's own flash
    attention, which summed an f16 cache's values in f16 in cell order, they were not: ops/llamacpp/patches makes
    it sum them in f32."""
    from service.engine.conversation import Conversation, Turn
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.llama_lm import LlamaLM

    pipe = DirectPipeline(_settings(*fp16_pair, "openvino"), language_model=LlamaLM)
    lm = pipe.lm
    prompt = pipe.prompt(Conversation((Turn("user", "Name three colours, then three shapes."),)), Generation())
    firsts = []

    def answer(n: int, tokens: int = 6) -> None:
        running = []
        for _ in range(n):
            s, keep = lm.claim(prompt, tokens)
            running.append({"seq": s, "feed": lm.feed(s, prompt, keep, 16), "logits": None, "ids": []})
        while any(len(r["ids"]) < tokens for r in running):
            filling = next((r for r in running if r["feed"] is not None), None)
            if filling is not None and (out := next(filling["feed"])) is not None:
                filling["logits"], filling["feed"] = out, None
                firsts.append(out)
            stepping = [r for r in running if r["feed"] is None and len(r["ids"]) < tokens]
            for r in stepping:
                r["ids"].append(int(np.argmax(r["logits"])))
            if stepping:
                rows = lm.step_many([(r["seq"], r["ids"][-1], prompt.next_position + len(r["ids"]) - 1)
                                     for r in stepping])
                for r, row in zip(stepping, rows, strict=True):
                    r["logits"] = row
        for r in running:
            lm.release(r["seq"])

    for n in (1, 3, 3):
        answer(n)
    lm.close()
    assert len(firsts) == 7
    for got in firsts[1:]:
        np.testing.assert_allclose(got, firsts[0], rtol=0, atol=1e-5 * float(np.abs(firsts[0]).max()))


def _cells_and_kv(layout, blob: bytes, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """A serialised sequence (service.engine.kv_handoff's layout) as its cells (without the sequence id, which
    llama.cpp discards on a read) and all its keys and values, as f32."""
    from service.engine.kv_handoff import GGML_TYPES

    at = len(layout.head) + 8
    cell = np.dtype([("pos", "<i4"), ("n", "<u4"), ("x", "<i4"), ("y", "<i4"), ("tok", "<i4"), ("seq", "<i4")])
    cells = np.frombuffer(blob, cell, tokens, at)
    at += cells.nbytes + 8
    kv = []
    for values, kind in ((False, layout.k_type), (True, layout.v_type)):
        dtype = np.dtype(GGML_TYPES[kind])
        for _ in range(layout.layers):
            if values and layout.v_trans:
                width = struct.unpack_from("<iII", blob, at)[2]
            else:
                width = struct.unpack_from("<iQ", blob, at)[1] // dtype.itemsize
            data = np.frombuffer(blob, dtype, tokens * width, at + 12)
            kv.append(data.astype(np.float32))
            at += 12 + data.nbytes
    assert at == len(blob)
    return cells[["pos", "n", "x", "y", "tok"]], np.stack(kv)


def test_the_handed_over_kv_is_what_llamacpp_computes(fp16_pair):
    """A prompt with an image computed by OpenVINO and written into a llama.cpp sequence holds what llama.cpp's own
    prefill of it holds: the same cells (positions incl. the image's M-RoPE rows, tokens, image cells marked), and
    keys and values within TOLERANCE of the largest (the same fp16 weights on both sides)."""
    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.llama_lm import LlamaLM

    blobs = []
    for prefill in ("openvino", "llamacpp"):
        pipe = DirectPipeline(_settings(*fp16_pair, prefill), language_model=LlamaLM)
        prompt = pipe.prompt(_conversation("Describe this image.", (150, 100)), Generation())
        pipe.lm.prefill(prompt)
        blobs.append(pipe.lm._worker.call("get_state", pipe.lm._active.seq))
        if prefill == "openvino":
            layout = pipe.lm._prefill.layout
        pipe.lm.close()
    assert not layout.v_trans  # flash attention is on (values stored by cell): a step skips other sequences' cells
    (cells, kv), (want_cells, want_kv) = (_cells_and_kv(layout, b, len(prompt.ids)) for b in blobs)
    assert (want_cells["tok"] == -1).sum() == sum(image.tokens for _, image, _ in prompt.images)
    assert (want_cells["x"] != want_cells["y"]).any()  # the image's rows are laid out in two dimensions
    np.testing.assert_array_equal(cells, want_cells)
    np.testing.assert_allclose(kv, want_kv, rtol=0, atol=TOLERANCE * float(np.abs(want_kv).max()))


def test_the_bench_times_steps_and_a_step_beside_kept_conversations(tiny_gguf, llama_lib):
    """ops.bench.llama_steps, in its own interpreter as the bench runs it: a row per step size (and 3 padded), and
    one sequence's step alone and beside the other sequences' kept conversations, with flash attention on and off;
    a model it cannot load is a failure that says so."""
    from ops.bench import llama_steps
    from service.engine.kept_sequences import SEQUENCES
    from service.engine.llamacpp_child import gguf_files

    lm = gguf_files(tiny_gguf).language_model
    result = llama_steps.run_subprocess(llama_lib, lm, threads=1)
    assert [(r["sequences"], r["padded"]) for r in result["rows"]] == list(llama_steps.CASES)
    kept = result["kept"]
    off = kept["flash_attention_off"]
    assert kept["others"] == SEQUENCES - 1 and min(kept["alone_ms"], kept["beside_ms"], *off.values()) > 0, result
    with pytest.raises(RuntimeError, match=r"llama\.cpp decode steps failed"):
        llama_steps.run_subprocess(llama_lib, lm.with_name("missing.gguf"), threads=1)

"""The direct engine (VLFLEET_ENGINE=direct) on the tiny model: the same answers as the reference implementation,
and follow-ups that run neither the vision encoder nor the earlier turns again (counted from /metrics)."""

from __future__ import annotations

import json
import socket
import types

import numpy as np
import pytest
from openai import OpenAI

from service.engine.conversation import Conversation, Turn
from service.engine.images import PreparedImage
from tests import servers
from tests.integration.conftest import image_message, png_bytes
from tests.integration.test_api_clients import _ui_chat

RUNS, REUSED = "vlfleet_vision_encoder_runs_total", "vlfleet_reused_prompt_tokens_total"
MODEL = "qwen3-vl-2b-instruct"


@pytest.fixture(scope="module")
def direct(tiny_model, tmp_path_factory):
    server = servers.start(tiny_model, tmp_path_factory.mktemp("direct"), VLFLEET_ENGINE="direct",
                           VLFLEET_ANSWER_CACHE_MB="0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(direct):
    return OpenAI(base_url=direct.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client, messages, max_tokens=6):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)


def _counters(server) -> tuple[float, float]:
    return server.metric(RUNS), server.metric(REUSED)


def test_stateless_follow_up_reuses_the_image_and_the_turns(direct, client):
    image = png_bytes((120, 90), (20, 160, 60))
    runs0 = direct.metric(RUNS)
    first = [image_message("What is in this image?", image)]
    answer = _ask(client, first)
    runs1, reused1 = _counters(direct)
    assert runs1 == runs0 + 1  # a new image is encoded once
    follow = [*first, {"role": "assistant", "content": answer.choices[0].message.content},
              {"role": "user", "content": "And its colour?"}]
    assert _ask(client, follow).choices[0].message.content is not None
    runs2, reused2 = _counters(direct)
    assert runs2 == runs1  # the client re-sent the image: it was kept, not encoded again
    # The first turn (its image tokens included) came from the KV state, not computed again.
    assert reused2 - reused1 >= answer.usage.prompt_tokens


def test_a_follow_up_reuses_the_answer_as_it_was_generated(tiny_model):
    """An answer generated as tokens its tokenizer would split otherwise (here each letter its own token): a
    follow-up that re-sends its text reuses every token the KV state holds, the prompt and all of the answer but
    its last token, because the text is taken back as the ids it was generated as (service.engine.answer_ids)."""
    from service.engine.conversation import Sampling
    from service.engine.direct_pipeline import Answer, DirectPipeline, Generation

    pipe = DirectPipeline(_settings(tiny_model))
    letters = [int(pipe._encode(c)[0]) for c in "the image shows"]
    assert list(pipe._encode("the image shows")) != letters  # the text alone would tokenize otherwise
    first = _conversation("Describe this image.")
    sent: list[str] = []
    answer = Answer(pipe, first, Sampling(max_tokens=len(letters), temperature=0), sent.append, lambda: False)
    logits, _ = pipe.lm.prefill(answer.prompt)
    for want in letters:  # the answer the logits choose: one letter after another
        logits = np.full_like(logits, -1e9)
        logits[want] = 0
        if (token := answer.next_token(logits)) is not None:
            logits = pipe.lm.step(token, answer.position)
    answer.finish()
    assert "".join(sent) == "the image shows"
    follow = Conversation((*first.turns, Turn("assistant", "".join(sent)), Turn("user", "Why?")))
    _, kept = pipe.lm.prefill(pipe.prompt(follow, Generation()))
    assert kept == len(answer.prompt.ids) + len(letters) - 1


def test_two_conversations_taking_turns_each_keep_their_kv(direct, client):
    """A, B, then A's and B's follow-ups: each finds its own turns kept (the direct engine keeps the KV of its last
    few conversations, service.engine.kept_sequences, not only the last one's)."""
    firsts = [[image_message(q, png_bytes((96, 72), c))]
              for q, c in (("Describe it.", (210, 40, 40)), ("What shape is it?", (40, 40, 210)))]
    answers = [_ask(client, f) for f in firsts]
    for first, answer in zip(firsts, answers, strict=True):
        reused0 = direct.metric(REUSED)
        follow = [*first, {"role": "assistant", "content": answer.choices[0].message.content},
                  {"role": "user", "content": "Why?"}]
        _ask(client, follow)
        assert direct.metric(REUSED) - reused0 >= answer.usage.prompt_tokens


def test_web_ui_session_follow_up_reuses_the_image(direct, tmp_path):
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes((100, 140), (200, 120, 10)))
    runs0 = direct.metric(RUNS)
    first = _ui_chat(direct, f"image=@{picture}", "question=What is in this picture?", "max_tokens=5")
    assert direct.metric(RUNS) == runs0 + 1
    follow = _ui_chat(direct, f"session={first['session']}", "question=Which colour dominates?", "max_tokens=5")
    assert follow["status"]["reused_session"] is True
    assert direct.metric(RUNS) == runs0 + 1


def test_each_answer_names_its_host_and_what_it_reused_there(direct, client):
    """What the load balancer's affinity is judged by (X-Served-By, X-Image-Cache), and the inference log line."""
    image = png_bytes((88, 66), (70, 10, 220))
    first = [image_message("Which host am I on?", image)]
    cold = client.chat.completions.with_raw_response.create(model=MODEL, messages=first, max_tokens=3, temperature=0)
    assert cold.headers["X-Served-By"] == socket.gethostname()
    assert (cold.headers["X-Image-Cache"], cold.headers["X-Session-Reused"]) == ("miss", "0")
    follow = [*first, {"role": "assistant", "content": cold.parse().choices[0].message.content},
              {"role": "user", "content": "Still?"}]
    warm = client.chat.completions.with_raw_response.create(model=MODEL, messages=follow, max_tokens=3,
                                                            temperature=0)
    assert (warm.headers["X-Image-Cache"], warm.headers["X-Session-Reused"]) == ("hit", "1")
    text_only = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "No picture."}], max_tokens=2, temperature=0)
    assert text_only.headers["X-Image-Cache"] == "none"
    rid = warm.headers["X-Request-Id"]

    def inference_line() -> dict | None:
        lines = (json.loads(ln) for ln in direct.log().splitlines() if ln.startswith("{"))
        return next((ln for ln in lines if ln.get("msg") == "inference" and ln.get("request_id") == rid), None)

    servers.wait_for(inference_line, what="the follow-up's inference line")
    line = inference_line()
    assert line["host"] == socket.gethostname() and line["images_encoded"] == 0 and line["prefix_reuse"] is True


def test_another_image_is_encoded(direct, client):
    runs0 = direct.metric(RUNS)
    _ask(client, [image_message("What is this?", png_bytes((64, 64), (1, 2, 3)))])
    _ask(client, [image_message("What is this?", png_bytes((64, 64), (3, 2, 1)))])
    assert direct.metric(RUNS) == runs0 + 2


def test_the_genai_engine_encodes_every_image_of_every_prompt(tiny_model, tmp_path):
    """The same metric on the serial engine: the follow-up runs the encoder again (what the direct engine saves)."""
    serial = servers.start(tiny_model, tmp_path, VLFLEET_ENGINE="serial", VLFLEET_ANSWER_CACHE_MB="0")
    try:
        oai = OpenAI(base_url=serial.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        first = [image_message("What is in this image?", png_bytes((80, 80), (9, 9, 200)))]
        runs0 = serial.metric(RUNS)  # the warm-up's image counts too
        answer = _ask(oai, first).choices[0].message.content
        _ask(oai, [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Sure?"}])
        assert serial.metric(RUNS) == runs0 + 2
    finally:
        serial.stop()


# f32 without dynamic quantisation on both sides, and an f32 KV cache (_settings): the reference comparison is of the
# arithmetic, so activations are not rounded to int8 (in groups that would differ between the two sides' settings),
# nor the prompt's keys and values to the cache's u8 (the paged attention reads them back from the cache).
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def _settings(model_dir) -> types.SimpleNamespace:
    return types.SimpleNamespace(model_dir=model_dir, device="CPU", threads=0, precision="f32", lm_precision="f32",
                                 dq_group_size="0", kv_precision="f32", model_cache_dir=None, image_cache_mb=64,
                                 vision_weights="compressed", kv_cache_gb=1)


def _conversation(question: str) -> Conversation:
    pixels = np.random.default_rng(0).integers(0, 255, (1, 70, 110, 3), dtype=np.uint8)
    return Conversation((Turn("user", question, (PreparedImage(pixels, "img", (110, 70)),)),))


def test_prefill_matches_the_reference_implementation(tiny_model):
    """The image processor's patches, the vision tower, the multimodal RoPE and the deepstack inputs, end to end:
    the last position's logits equal optimum-intel's OVModelForVisualCausalLM on the same artifact and inputs."""
    import torch
    from optimum.intel import OVModelForVisualCausalLM

    from service.engine.direct_pipeline import DirectPipeline, Generation
    from service.engine.vision import patches

    pipe = DirectPipeline(_settings(tiny_model))
    conv = _conversation("Describe this image.")
    prompt = pipe.prompt(conv, Generation())
    mine, _ = pipe.lm.prefill(prompt)
    reference = OVModelForVisualCausalLM.from_pretrained(tiny_model, ov_config=EXACT)
    flat, grid = patches(conv.images[0].pixels, pipe.vision.cfg)
    ids = torch.from_numpy(prompt.ids[None])
    out = reference(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=torch.from_numpy(flat),
                    image_grid_thw=torch.tensor([grid]))
    np.testing.assert_allclose(mine, out.logits[0, -1].numpy(), rtol=1e-4, atol=1e-4)


def test_a_kept_state_gives_the_logits_of_a_fresh_prefill(tiny_model):
    """Continuing from the KV state (cut back to the common prefix) computes what a fresh prefill computes."""
    from service.engine.direct_pipeline import DirectPipeline, Generation

    pipe = DirectPipeline(_settings(tiny_model))
    first = _conversation("Describe this image.")
    pipe.lm.prefill(pipe.prompt(first, Generation()))
    for token in (11, 12, 13):  # an answer the follow-up below does not repeat: the state must be cut
        pipe.lm.step(token, 10_000)
    follow = Conversation((*first.turns, Turn("assistant", "a picture"), Turn("user", "Which colour?")))
    prompt = pipe.prompt(follow, Generation())
    warm, kept = pipe.lm.prefill(prompt)
    assert 0 < kept < len(prompt.ids)
    pipe.lm.reset()
    cold, kept_cold = pipe.lm.prefill(prompt)
    assert kept_cold == 0
    np.testing.assert_allclose(warm, cold, rtol=0, atol=1e-2 * float(np.abs(cold).max()))


def test_the_patch_embedding_runs_as_a_matmul_with_the_convolutions_output(tiny_model):
    """The vision encoder compiles the patch embedding's Conv3d as a MatMul (vision._patch_embedding_as_matmul):
    the rewritten graph gives the exported convolution's output (both at f32), and no convolution is left in it or
    in what the encoder compiles."""
    import openvino as ov

    from service.engine.vision import VisionConfig, VisionEncoder, _patch_embedding_as_matmul, patches

    core, xml = ov.Core(), str(tiny_model / "openvino_vision_embeddings_model.xml")
    rewritten = core.read_model(xml)
    _patch_embedding_as_matmul(rewritten)
    assert "Convolution" not in {op.get_type_name() for op in rewritten.get_ops()}
    flat, _ = patches(_conversation("").images[0].pixels, VisionConfig.of_model(tiny_model))
    exported = core.compile_model(xml, "CPU", EXACT)({"hidden_states": flat})[0]
    mine = core.compile_model(rewritten, "CPU", EXACT)({"hidden_states": flat})[0]
    assert mine.shape == exported.shape
    assert np.abs(mine - exported).max() <= 1e-5 * np.abs(exported).max()
    compiled = VisionEncoder(core, tiny_model, "CPU", EXACT, 0)._patch_embed.get_compiled_model()
    layers = {op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()}
    assert "Convolution" not in layers and "FullyConnected" in layers


def test_decompressed_vision_weights_give_the_compressed_encoders_output(tiny_model):
    """VLFLEET_VISION_WEIGHTS=decompressed (vision.decompress_weights): the artifact's int8 merger weights become f16
    constants, so the compiled merger runs plain FullyConnected layers, and encodes an image to the compressed
    encoder's embeddings within f16's rounding of each unpacked weight (both at f32). The tiny IR's chains carry no
    decompression mark, so the plugin unpacks them itself there; on the 2b IR it keeps them for its compressed kernel
    unless they are unpacked here, and the bench's levers table times both."""
    import openvino as ov

    from service.engine.vision import VisionEncoder, decompress_weights

    core = ov.Core()
    merger = core.read_model(str(tiny_model / "openvino_vision_embeddings_merger_model.xml"))
    int8 = sum(op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.i8 for op in merger.get_ops())
    assert int8 and decompress_weights(merger) == int8
    pixels = _conversation("").images[0].pixels
    packed, unpacked = (VisionEncoder(core, tiny_model, "CPU", EXACT, 0, decompress) for decompress in (False, True))
    def layers(encoder) -> set[str]:
        runtime = encoder._merger.get_compiled_model().get_runtime_model()
        return {op.get_rt_info()["layerType"].astype(str) for op in runtime.get_ops()}

    assert "FullyConnected" in layers(unpacked) and "FullyConnectedCompressed" not in layers(unpacked)
    want, got = packed.encode(pixels, "a"), unpacked.encode(pixels, "a")
    for mine, theirs in ((got.embeds, want.embeds), (got.deepstack, want.deepstack)):
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= 1e-2 * np.abs(theirs).max()

"""The hybrid engine's bookkeeping around llama.cpp (service/engine/llama_lm.py), with a recording stand-in for the
child process: which sequence a prompt continues, what is cut and forgotten, and the rows and positions sent. The
real child and libllama are in tests/integration/test_hybrid_engine.py."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from service.engine import kv_handoff, llama_lm, llama_worker
from service.engine.prompt import Prompt
from service.engine.vision import EncodedImage

HIDDEN, LAYERS = 4, 2


class FakeWorker:
    """Records each call; the logits are the call's number, so a test can tell which call's they are."""

    def __init__(self):
        self.calls: list[tuple] = []

    def call(self, name, *args):
        self.calls.append((name, *args))
        if name in ("tokens", "embeddings"):
            return np.full(3, len(self.calls), np.float32) if args[-1] else None
        if name == "step":
            return np.zeros((len(args[0]), 3), np.float32)
        return None

    def alive(self):
        return True


def lm(n_ctx: int = 1000) -> llama_lm.LlamaLM:
    out = llama_lm.LlamaLM.__new__(llama_lm.LlamaLM)  # no child: the bookkeeping only
    out._worker, out.n_ctx, out.vocab_size = FakeWorker(), n_ctx, 3
    out._sequences = [llama_lm.Sequence(i) for i in range(llama_lm.SEQUENCES)]
    out._active = out._sequences[0]
    out._prefill = None
    return out


def image(tokens: int = 4, grid=(1, 2, 2), seed: int = 0) -> EncodedImage:
    rng = np.random.default_rng(seed)
    return EncodedImage(rng.random((tokens, HIDDEN), np.float32), rng.random((LAYERS, tokens, HIDDEN), np.float32),
                        grid)


def prompt(text_before: list[int], img: EncodedImage | None, text_after: list[int], digest: str = "d1") -> Prompt:
    ids = [*text_before, *([9] * img.tokens if img else []), *text_after]
    images = [(len(text_before), img, digest)] if img else []
    return Prompt(np.asarray(ids, np.int64), images)


def test_an_image_row_is_its_embedding_then_each_deepstack_layers_feature():
    img = image()
    rows = llama_lm.image_rows(img, 1)
    assert rows.shape == (3, HIDDEN * (1 + LAYERS))
    np.testing.assert_array_equal(rows[0], np.concatenate([img.embeds[1], img.deepstack[0, 1], img.deepstack[1, 1]]))


def test_a_prompt_is_fed_as_text_image_text_with_the_image_at_t_y_x_zero():
    m, p = lm(), prompt([1, 2], image(), [3, 4, 5])
    logits, keep = m.prefill(p)
    names = [c[0] for c in m._worker.calls]
    assert (names, keep) == (["tokens", "embeddings", "tokens"], 0)
    _, _, rows, pos4, last = m._worker.calls[1]
    assert rows.shape == (4, HIDDEN * (1 + LAYERS)) and not last
    # positions 0, 1 for the text; the 2x2 image at t=2, y=2+row, x=2+col; the text after it past its larger side
    assert pos4.tolist() == [[2, 2, 2, 0], [2, 2, 3, 0], [2, 3, 2, 0], [2, 3, 3, 0]]
    assert m._worker.calls[2][3].tolist() == [4, 5, 6] and m._worker.calls[2][4] is True
    assert logits[0] == 3  # the last call's logits


def test_a_follow_up_continues_its_sequence_and_a_new_conversation_takes_an_empty_one():
    m = lm()
    first = prompt([1, 2], image(), [3, 4])
    m.prefill(first)
    s0 = m._active
    m.step(7, 10)
    follow = prompt([1, 2], image(), [3, 4, 7, 8, 8])
    _, keep = m.prefill(follow)
    assert m._active is s0 and keep == 9  # the first turn and the answer's token came from the KV
    other = prompt([1, 5], image(seed=1), [6], digest="d2")  # shares the chat template's first token only
    _, keep = m.prefill(other)
    assert m._active is not s0 and keep == 0 and s0.keys  # the first conversation is still kept


def test_a_cut_never_falls_inside_an_image():
    m = lm()
    m.prefill(prompt([1, 2], image(), [3]))
    s = m._active
    m._worker.calls.clear()
    assert m._keep(s, prompt([1, 2], image(), [])) == 2  # ends with the image: recompute all of it
    assert m._worker.calls == [("seq_rm", s.seq, 2)]  # by the image's first position


def test_room_forgets_idle_sequences_oldest_first_and_never_a_busy_one():
    m = lm(n_ctx=20)
    a, b = prompt([1, 2, 3, 4, 5, 6], None, []), prompt([1, 7, 7, 7, 7, 7], None, [])
    m.prefill(a)
    sa = m._active
    m.prefill(b)
    sb = m._active
    claimed = m.claim(prompt([1, 8, 8, 8], None, []), 10)  # 4 + 10 reserved: one of the others must go
    assert claimed is not None and not sa.keys and sb.keys  # the one used longest ago
    s, kept = claimed
    assert s.busy and s.reserve == 14 and kept == 0
    assert m.claim(prompt([1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], None, []), 10) is None  # no room beside the busy one
    assert sb.keys  # not forgotten for nothing
    m.release(s)
    assert m.claim(prompt([1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], None, []), 5) is not None


def test_a_shim_of_another_interface_is_refused_with_the_fix(tmp_path):
    """A service calling a libvlfleet_llama.so built from another vlfleet_llama.c would crash on the first changed
    signature; its interface number is checked first, and no number is the first interface."""
    if shutil.which("cc") is None:
        pytest.fail("cc not found: install gcc (.ci/run does)")
    for name, body in (("old", "int x(void) { return 0; }"), ("next", "int vl_interface(void) { return 99; }")):
        (tmp_path / f"{name}.c").write_text(body + "\n")
        lib = tmp_path / f"lib{name}.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / f"{name}.c")], check=True)
        found = 1 if name == "old" else 99
        with pytest.raises(RuntimeError, match=rf"lib{name}.so is interface {found} of libvlfleet_llama.so and this "
                                               rf"service needs {llama_worker.INTERFACE}: install the "
                                               r"vlfleet-llama-server wheel of this release"):
            llama_worker.Model(str(lib), "model.gguf", 256, 1, 1, 32)


class FakePrefill:
    """OpenVINO's prefill as service.engine.kv_handoff.OpenVINOPrefill is used: its choice, logits and a state."""

    worth = staticmethod(kv_handoff.OpenVINOPrefill.worth)

    def __init__(self):
        self.prompts: list[Prompt] = []

    def feed(self, p: Prompt, chunk: int):
        self.prompts.append(p)
        for _ in range(0, len(p.ids) - chunk, chunk):
            yield None
        yield b"state"


def test_a_new_conversation_is_computed_by_openvino_and_its_follow_up_by_llamacpp():
    m = lm()
    m._prefill = FakePrefill()
    first = prompt(list(range(1, 13)), image(), [3, 4])  # 18 tokens: at least kv_handoff.MIN_TOKENS
    assert m.prefill_on(len(first.ids), 0) == "openvino"
    logits, keep = m.prefill(first)
    assert keep == 0 and m._prefill.prompts == [first]
    assert m._worker.calls[0] == ("set_state", m._active.seq, b"state")
    assert m._worker.calls[1][0] == "tokens" and m._worker.calls[1][2].tolist() == [4]  # the last token alone
    assert logits[0] == 2  # the last token's, computed by llama.cpp
    assert m._active.keys == list(first.keys)  # what the sequence holds now, for the follow-up's prefix
    m.step(7, first.next_position)
    m._worker.calls.clear()
    follow = prompt(list(range(1, 13)), image(), [3, 4, 7, 8, 8])
    _, keep = m.prefill(follow)
    assert keep == len(first.ids) + 1 and [c[0] for c in m._worker.calls] == ["tokens"]  # its new turn only
    assert m._prefill.prompts == [first]


def test_a_short_prompt_and_a_long_kept_prefix_stay_on_llamacpp():
    m = lm()
    m._prefill = FakePrefill()
    short = prompt([1, 2], image(), [3])
    assert m.prefill_on(len(short.ids), 0) == "llamacpp"
    m.prefill(short)
    assert m._prefill.prompts == [] and [c[0] for c in m._worker.calls] == ["tokens", "embeddings", "tokens"]
    assert m.prefill_on(100, 40) == "llamacpp" and m.prefill_on(100, 30) == "openvino"  # recomputing 30 beats 70

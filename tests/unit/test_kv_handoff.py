"""llama.cpp's serialised sequence as service/engine/kv_handoff.py writes it: the layout read back from a blob of
one token, the cells and the keys and values of a prompt. That llama.cpp reads it, and holds then what its own
prefill holds, is tests/integration/test_hybrid_engine.py's."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from service.engine import kv_handoff
from service.engine.kv_handoff import Layout, LayoutError, sequence_state
from service.engine.prompt import Prompt
from service.engine.vision import EncodedImage

WIDTH, LAYERS = 6, 3


def kv(tokens: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return ([rng.random((tokens, WIDTH), np.float32) for _ in range(LAYERS)],
            [rng.random((tokens, WIDTH), np.float32) for _ in range(LAYERS)])


def image_prompt() -> Prompt:
    img = EncodedImage(np.zeros((6, 4), np.float32), np.zeros((2, 6, 4), np.float32), (1, 2, 3))
    return Prompt(np.array([5, 6, 9, 9, 9, 9, 9, 9, 7], np.int64), [(2, img, "d")])


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("ext", [True, False])
@pytest.mark.parametrize("types", [(1, 1), (0, 1)])
def test_the_layout_of_a_one_token_sequence_is_read_back(v_trans, ext, types):
    layout = Layout(LAYERS, *types, v_trans, ext, head=b"\xd8\x3c\x14\xaf\x02\x00\x00\x00")
    one = Prompt(np.array([42], np.int64), [])
    assert Layout.probe(sequence_state(layout, one, *kv(1))) == layout


def test_a_quantised_cache_is_refused_by_name():
    layout = Layout(LAYERS, 1, 1, False, True, head=b"\0" * 8)
    blob = bytearray(sequence_state(layout, Prompt(np.array([42], np.int64), []), *kv(1)))
    at = 8 + 8 + 24 + 8  # head, streams and cells, the cell, v_trans and layers: the first key's type
    blob[at:at + 4] = struct.pack("<i", 8)  # GGML_TYPE_Q8_0
    with pytest.raises(LayoutError, match="quantised KV cache"):
        Layout.probe(bytes(blob))


def test_the_cells_carry_the_m_rope_rows_and_image_tokens_carry_no_token():
    layout = Layout(LAYERS, 1, 1, False, True)
    p = image_prompt()
    blob = sequence_state(layout, p, *kv(len(p.ids)))
    cell = np.dtype([("pos", "<i4"), ("n", "<u4"), ("x", "<i4"), ("y", "<i4"), ("tok", "<i4"), ("seq", "<i4")])
    cells = np.frombuffer(blob, cell, len(p.ids), 8)
    assert cells["pos"].tolist() == p.positions[0].tolist()
    assert cells["y"].tolist() == p.positions[1].tolist() and cells["x"].tolist() == p.positions[2].tolist()
    assert cells["tok"].tolist() == [5, 6, -1, -1, -1, -1, -1, -1, 7]
    assert cells["y"][2:8].tolist() == [2, 2, 2, 3, 3, 3] and cells["x"][2:8].tolist() == [2, 3, 4, 2, 3, 4]


@pytest.mark.parametrize("v_trans", [False, True])
def test_keys_are_rows_per_token_and_values_per_channel_when_transposed(v_trans):
    layout = Layout(LAYERS, 1, 0, v_trans, False)
    p = Prompt(np.array([1, 2, 3, 4], np.int64), [])
    keys, values = kv(4)
    blob = sequence_state(layout, p, keys, values)
    at = 8 + 4 * 12 + 8
    first_key = np.frombuffer(blob, np.float16, 4 * WIDTH, at + 12).reshape(4, WIDTH)
    np.testing.assert_allclose(first_key, keys[0], atol=1e-3)
    first_value = blob.index(struct.pack("<i", 0), at + LAYERS * (12 + 4 * WIDTH * 2))  # the values' type
    data = np.frombuffer(blob, np.float32, 4 * WIDTH, first_value + 12)
    np.testing.assert_array_equal(data, (values[0].T if v_trans else values[0]).ravel())


def test_kv_of_another_model_is_refused():
    with pytest.raises(LayoutError, match="layers"):
        sequence_state(Layout(LAYERS + 1, 1, 1, False, True), Prompt(np.array([1], np.int64), []), *kv(1))


def test_short_prompts_stay_on_llamacpp():
    assert not kv_handoff.OpenVINOPrefill.worth(kv_handoff.MIN_TOKENS - 1, 0)
    assert kv_handoff.OpenVINOPrefill.worth(kv_handoff.MIN_TOKENS, 0)

"""The direct engine's pure parts: image placeholders, multimodal RoPE positions, prefix keys, stop strings and
sampling (tests/integration/test_direct_engine.py runs the whole engine on the tiny model)."""

from __future__ import annotations

import numpy as np

from service.engine.conversation import Sampling
from service.engine.direct_pipeline import TextOut, pick
from service.engine.prompt import common_prefix, expand_images, mrope_positions
from service.engine.prompt_limits import VisionGrid
from service.engine.vision import EncodedImage, VisionConfig, merge_order, patches

IMG = 7


def image(t: int, h: int, w: int) -> EncodedImage:
    n = t * h * w
    return EncodedImage(np.zeros((n, 4), np.float32), np.zeros((3, n, 4), np.float32), (t, h, w))


def test_each_placeholder_becomes_the_images_tokens_and_their_positions_follow_qwen3_vl():
    ids = np.array([1, 2, IMG, 3, 4], dtype=np.int64)
    prompt = expand_images(ids, IMG, [(image(1, 2, 3), "a")])
    assert prompt.ids.tolist() == [1, 2] + [IMG] * 6 + [3, 4]
    # text 0, 1; the image's (t, h, w) grid from 2; text continues after its largest extent (3): 5, 6
    assert prompt.positions[:, :2].tolist() == [[0, 1]] * 3
    assert prompt.positions[:, 2:8].tolist() == [[2] * 6, [2, 2, 2, 3, 3, 3], [2, 3, 4, 2, 3, 4]]
    assert prompt.positions[:, 8:].tolist() == [[5, 6]] * 3
    assert prompt.next_position == 7


def test_two_images_and_text_between():
    ids = np.array([IMG, 9, IMG], dtype=np.int64)
    placed = [(0, image(1, 1, 2), "a"), (3, image(1, 2, 2), "b")]
    positions, nxt = mrope_positions(7, placed)
    assert positions[0].tolist() == [0, 0, 2, 3, 3, 3, 3]
    assert nxt == 5
    prompt = expand_images(ids, IMG, [(placed[0][1], "a"), (placed[1][1], "b")])
    assert [start for start, _, _ in prompt.images] == [0, 3]


def test_image_tokens_are_keyed_by_their_image_so_a_different_image_is_not_a_common_prefix():
    ids = np.array([1, IMG, 2], dtype=np.int64)
    a = expand_images(ids, IMG, [(image(1, 1, 2), "red")])
    b = expand_images(ids, IMG, [(image(1, 1, 2), "blue")])
    assert a.ids.tolist() == b.ids.tolist()
    assert common_prefix(a.keys, b.keys) == 1
    assert common_prefix(a.keys, (*a.keys, 5)) == len(a.keys)


def test_a_placeholder_count_that_does_not_match_the_images_is_refused():
    try:
        expand_images(np.array([1, IMG, IMG]), IMG, [(image(1, 1, 1), "a")])
    except ValueError as e:
        assert "2 image placeholders for 1 images" in str(e)
    else:
        raise AssertionError("no error")


class Decoder:
    def __init__(self, pieces):
        self.pieces = pieces

    def push(self, ids):
        return self.pieces[ids[0]]

    def flush(self):
        return ""


def test_stop_string_across_pieces_is_never_sent():
    sent = []
    out = TextOut(Decoder({0: "Hello wo", 1: "rld. EN", 2: "D here"}), ["END"], sent.append)
    assert [out.push(0), out.push(1), out.push(2)] == [False, False, True]
    assert "".join(sent) == "Hello world. "


def test_without_stop_strings_every_piece_goes_out_at_once():
    sent = []
    out = TextOut(Decoder({0: "a", 1: "b"}), [], sent.append)
    out.push(0)
    out.push(1)
    assert sent == ["a", "b"]


def test_greedy_picks_the_largest_logit_and_sampling_follows_the_seed():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert pick(logits, Sampling(max_tokens=1), np.random.default_rng(0)) == 1
    warm = Sampling(max_tokens=1, temperature=1.0, top_p=0.9, seed=3)
    draws = [pick(logits, warm, np.random.default_rng(3)) for _ in range(3)]
    assert len(set(draws)) == 1 and draws[0] in (1, 2)  # same seed, same draw; only the nucleus
    narrow = Sampling(max_tokens=1, temperature=1.0, top_p=0.01, seed=3)
    assert {pick(logits, narrow, np.random.default_rng(s)) for s in range(20)} == {1}


def test_patches_are_in_merge_block_order():
    cfg = VisionConfig(patch=2, merge=2, temporal_patch=2, heads=1, hidden=4, grid_side=4, mean=(0.0,) * 3,
                       std=(1.0,) * 3, grid=VisionGrid(patch=2, merge=2, min_pixels=16, max_pixels=4096))
    pixels = np.zeros((1, 8, 8, 3), np.uint8)
    pixels[0, :4, :4] = 255  # the top-left merge block (2x2 patches of 2x2 pixels) is white
    flat, grid = patches(pixels, cfg)
    assert grid == (1, 4, 4) and flat.shape == (16, 3 * 2 * 2 * 2)
    assert np.all(flat[:4] == 1.0) and np.all(flat[4:] == 0.0)  # the block's four patches come first
    rows = np.arange(16).reshape(16, 1)
    assert merge_order(rows, grid, 2)[:4, 0].tolist() == [0, 1, 4, 5]

"""A conversation's tokens as Qwen3-VL's language model sees them (every engine over the artifact's sub-models:
direct, paged, hybrid).

Each image placeholder is expanded to as many tokens as the image has, and every token gets a key: its id, or for
an image token (digest, index), since every image token has the same id. Kept KV is matched against those keys, so
a prompt is computed only after the longest prefix a kept conversation shares with it.

Positions are Qwen3-VL's multimodal RoPE: three rows (time, height, width); text advances all three by one, an
image's tokens take their (t, h, w) place in the merged grid, and the text after it continues past the image's
largest extent. The deepstack features of each image token go in beside its embedding (``prompt_rows``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from service.engine.vision import EncodedImage


@dataclass(frozen=True)
class TokenIds:
    image: int
    vision_start: int
    vision_end: int
    eos: tuple[int, ...]

    @classmethod
    def of_model(cls, model_dir: Path) -> TokenIds:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        try:
            gen = json.loads((Path(model_dir) / "generation_config.json").read_text())
        except OSError:
            gen = {}
        eos = gen.get("eos_token_id", cfg.get("text_config", {}).get("eos_token_id", []))
        return cls(int(cfg["image_token_id"]), int(cfg["vision_start_token_id"]), int(cfg["vision_end_token_id"]),
                   tuple(eos) if isinstance(eos, list) else (int(eos),))


@dataclass
class Prompt:
    """A conversation's tokens as the language model sees them: image placeholders expanded, positions set."""

    ids: np.ndarray  # (S,) int64
    images: list[tuple[int, EncodedImage, str]]  # (first token, encoded image, digest)
    positions: np.ndarray = field(init=False)  # (3, S)
    next_position: int = field(init=False)
    keys: tuple = field(init=False)  # token ids, image tokens replaced by (digest, index)
    text: str = ""  # the rendered conversation it was made of (DirectPipeline.prompt)
    text_ids: np.ndarray | None = None  # that text's ids, one placeholder per image

    def __post_init__(self):
        self.positions, self.next_position = mrope_positions(len(self.ids), self.images)
        keys: list = self.ids.tolist()
        for start, image, digest in self.images:
            keys[start:start + image.tokens] = [(digest, i) for i in range(image.tokens)]
        self.keys = tuple(keys)


def expand_images(ids: np.ndarray, image_token: int, images: list[tuple[EncodedImage, str]]) -> Prompt:
    """``ids`` with one placeholder per image -> a Prompt with as many placeholders as each image has tokens."""
    at = np.flatnonzero(ids == image_token)
    if len(at) != len(images):
        raise ValueError(f"the prompt has {len(at)} image placeholders for {len(images)} images")
    pieces, placed, cursor, total = [], [], 0, 0
    for pos, (image, digest) in zip(at, images, strict=True):
        pieces.append(ids[cursor:pos])
        total += pos - cursor
        placed.append((int(total), image, digest))
        pieces.append(np.full(image.tokens, image_token, dtype=np.int64))
        total += image.tokens
        cursor = pos + 1
    pieces.append(ids[cursor:])
    return Prompt(np.concatenate(pieces).astype(np.int64), placed)


def mrope_positions(length: int, images: list[tuple[int, EncodedImage, str]]) -> tuple[np.ndarray, int]:
    """(3, length) positions and the next free position (Qwen3-VL's get_rope_index for still images)."""
    pos = np.empty((3, length), dtype=np.int64)
    cursor, nxt = 0, 0
    for start, image, _ in images:
        pos[:, cursor:start] = np.arange(nxt, nxt + start - cursor)
        nxt += start - cursor
        pos[:, start:start + image.tokens] = nxt + np.indices(image.grid).reshape(3, -1)
        nxt += max(image.grid)
        cursor = start + image.tokens
    pos[:, cursor:] = np.arange(nxt, nxt + length - cursor)
    return pos, nxt + length - cursor


def prompt_rows(embed, prompt: Prompt, a: int, b: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Prompt tokens a..b as the language model takes them: embeddings (``embed``, the text embeddings' infer
    request; image tokens' rows from the vision tower), which are image tokens, and those tokens' deepstack
    features."""
    embeds = embed.infer({"input": prompt.ids[None, a:b]})[0][0].copy()
    mask, deepstack = np.zeros(b - a, bool), []
    for start, image, _ in prompt.images:
        lo, hi = max(start, a), min(start + image.tokens, b)
        if hi > lo:
            embeds[lo - a:hi - a] = image.embeds[lo - start:hi - start]
            mask[lo - a:hi - a] = True
            deepstack.append(image.deepstack[:, lo - start:hi - start])
    return embeds, mask, deepstack


def common_prefix(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

"""Qwen3-VL's language model as one stateful OpenVINO request that keeps the KV of the conversation it last saw.

The exported language model is stateful: its KV cache lives inside the request between calls. Each prompt is
compared with what the cache already holds, token by token (image tokens compared by the image's digest, since
every image token has the same id): only the part after the longest common prefix is computed. A follow-up, or a
stateless client resending the conversation so far, pays for its new turn only; a different conversation cuts the
cache back to the common prefix (the system prompt, at least the chat template's first tokens).

Positions are Qwen3-VL's multimodal RoPE: three rows (time, height, width); text advances all three by one, an
image's tokens take their (t, h, w) place in the merged grid, and the text after it continues past the image's
largest extent. The deepstack features of each image token go in beside its embedding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
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


class StatefulLM:
    """The compiled language model and text embeddings, one KV state, and the keys of what that state holds."""

    def __init__(self, core, model_dir: Path, device: str, properties: dict):
        model = core.read_model(str(Path(model_dir) / "openvino_language_model.xml"))
        _logits_of_last_position(model)
        self._request = core.compile_model(model, device, properties).create_infer_request()
        self._embed = core.compile_model(str(Path(model_dir) / "openvino_text_embeddings_model.xml"), device,
                                         properties).create_infer_request()
        deepstack = model.input("deepstack_visual_embeds").get_partial_shape()
        self._layers = 0 if deepstack[0].is_dynamic else deepstack[0].get_length()
        self._hidden = model.input("inputs_embeds").get_partial_shape()[2].get_length()
        self.vocab_size = model.output("logits").get_partial_shape()[2].get_length()  # logits per position
        # The sequence axis of each KV variable: its last dynamic dimension (the first is the batch).
        self._seq_axis = {v.info.variable_id: [i for i, d in enumerate(v.info.data_shape) if d.is_dynamic][-1]
                          for v in model.get_variables()}
        self.keys: list = []  # one entry per token in the KV state

    def reset(self) -> None:
        self._request.reset_state()
        self.keys = []

    def prefill(self, prompt: Prompt) -> tuple[np.ndarray, int]:
        """Logits after the prompt, and how many of its tokens came from the KV state instead of being computed."""
        keep = min(common_prefix(tuple(self.keys), prompt.keys), len(prompt.keys) - 1)
        self._cut(keep)
        *_, logits = self.feed(prompt, keep, len(prompt.ids))
        return logits, keep

    def feed(self, prompt: Prompt, keep: int, chunk: int, end: int | None = None) -> Iterator[np.ndarray | None]:
        """Compute ``prompt`` after its first ``keep`` tokens (what the state holds) up to ``end`` (default: all of
        it), at most ``chunk`` tokens per call; yields None after each call but the last, and the logits after it."""
        end = len(prompt.ids) if end is None else end
        for a in range(keep, end, chunk):
            b = min(a + chunk, end)
            embeds, mask, deepstack = prompt_rows(self._embed, prompt, a, b)
            logits = self._infer(embeds[None], prompt.positions[:, a:b], mask[None], deepstack)
            self.keys.extend(prompt.keys[a:b])
            yield logits if b == end else None

    def kv(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The state's keys and values, one (tokens, kv heads x head size) array per layer, in layer order
        (service.engine.kv_handoff hands them to llama.cpp)."""
        found: dict[tuple[str, int], np.ndarray] = {}
        for state in self._request.query_state():
            layer, kind = _kv_variable(state.name)
            value = state.state.data[0]  # (kv heads, tokens, head size): the batch axis first, tokens third
            found[kind, layer] = value.transpose(1, 0, 2).reshape(value.shape[1], -1)
        layers = range(len(found) // 2)
        return [found["key", i] for i in layers], [found["value", i] for i in layers]

    def step(self, token: int, position: int) -> np.ndarray:
        """Logits after one more token at ``position`` (all three RoPE rows advance together for text)."""
        embeds = self._embed.infer({"input": np.array([[token]], dtype=np.int64)})[0]
        logits = self._infer(embeds, np.full((3, 1), position, dtype=np.int64), np.zeros((1, 1), bool), [])
        self.keys.append(token)
        return logits

    def _infer(self, embeds: np.ndarray, positions: np.ndarray, mask: np.ndarray, deepstack: list) -> np.ndarray:
        n = embeds.shape[1]
        # With no image token in the chunk the exported graph still gathers one row per position: give it zeros.
        ds = (np.concatenate(deepstack, axis=1) if deepstack
              else np.zeros((self._layers, n, self._hidden), np.float32))
        out = self._request.infer({
            "inputs_embeds": embeds, "attention_mask": np.ones((1, len(self.keys) + n), dtype=np.int64),
            "position_ids": positions[:, None, :], "visual_pos_masks": mask, "deepstack_visual_embeds": ds,
            "beam_idx": np.zeros(1, dtype=np.int32)})
        return np.array(out["logits"][0, -1])

    def _cut(self, length: int) -> None:
        """Shorten the KV state to its first ``length`` tokens."""
        if length >= len(self.keys):
            return
        if length == 0:
            self.reset()
            return
        for state in self._request.query_state():
            value = state.state.data
            state.state = _tensor(np.take(value, np.arange(length), axis=self._seq_axis[state.name]))
        del self.keys[length:]


def _kv_variable(name: str) -> tuple[int, str]:
    """(layer, "key" or "value") of an exported KV variable, named like past_key_values.3.keypresent.3.key."""
    found = re.match(r"past_key_values\.(\d+)\.(key|value)", name)
    if found is None:
        raise ValueError(f"{name!r} is not a KV variable this service knows")
    return int(found[1]), found[2]


def _tensor(array: np.ndarray):
    import openvino as ov

    return ov.Tensor(np.ascontiguousarray(array))


def _logits_of_last_position(model) -> None:
    """Compute the vocabulary projection for the last position only: generation needs no other, and for a long
    prompt the full (positions x vocabulary) product costs as much as a layer or more."""
    import openvino.opset13 as ops

    head = model.output("logits").get_node().input_value(0).get_node()
    while head.get_type_name() != "MatMul":
        head = head.input_value(0).get_node()
    hidden = head.input_value(0)
    last = ops.gather(hidden, ops.constant(np.array([-1], dtype=np.int64)), ops.constant(np.int64(1)))
    head.input(0).replace_source_output(last.output(0))
    model.validate_nodes_and_infer_types()

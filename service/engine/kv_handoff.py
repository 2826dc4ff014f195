"""A prompt's prefill on OpenVINO, its decode on llama.cpp: the KV the one computed, handed to the other.

Where the hybrid engine runs (AMD EPYC: docs/engines.md), llama.cpp decodes faster than OpenVINO but computes a
prompt about half as fast (OpenVINO's int8 kernels take the prefill's matmuls). So a new conversation's prompt is
computed by the artifact's own OpenVINO language model (service.engine.paged_lm, a cache used only for this), and
its keys and values go into the conversation's llama.cpp sequence; the answer's tokens, and the follow-ups' new
turns, are llama.cpp's.

Both hold the same thing: per layer and token, the RoPE-rotated key and the value of each KV head (OpenVINO:
(kv heads, tokens, head size) per layer; llama.cpp: one row of kv heads x head size per cell), and the tokens'
M-RoPE positions. What llama.cpp takes is its own serialised sequence (llama_state_seq_set_data). Its layout is read
from llama.cpp itself, not assumed: ``Layout.probe`` parses what it writes for a one-token sequence (cache types,
row sizes, whether values are stored transposed, the M-RoPE cell fields); a layout this module does not know
(a quantised cache type) is named in a warning at load, and the engine computes prompts on llama.cpp instead.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.engine.paged_lm import PagedLM
from service.engine.prompt import Prompt

GGML_TYPES = {0: np.float32, 1: np.float16}  # ggml_type ids of the cache types written here
NO_TOKEN = -1  # LLAMA_TOKEN_NULL: a cell made from an embedding row (an image token)
# Prompts shorter than this stay on llama.cpp: the handover's fixed costs (the KV read out, serialised, sent to the
# child and written in) are then a larger part than the prefill it saves.
MIN_TOKENS = 16


class LayoutError(ValueError):
    """llama.cpp's serialised sequence is not in a layout this module can write."""


@dataclass(frozen=True)
class Layout:
    layers: int
    k_type: int
    v_type: int
    v_trans: bool  # values stored one row per channel (llama.cpp without flash attention)
    ext: bool  # each cell also carries its M-RoPE (x, y) position and its token
    head: bytes = b""  # what comes before the cache's own part (llama_context's magic and source sequence)

    @property
    def k_dtype(self):
        return GGML_TYPES[self.k_type]

    @property
    def v_dtype(self):
        return GGML_TYPES[self.v_type]

    @classmethod
    def probe(cls, blob: bytes) -> Layout:
        """The layout of ``blob``, llama.cpp's serialisation of a sequence holding one token."""
        for head, ext in ((8, True), (8, False), (0, True), (0, False)):  # the one that accounts for every byte
            try:
                return _parse(blob, head, ext)
            except (struct.error, LayoutError):
                continue
        raise LayoutError(f"llama.cpp's serialised sequence ({len(blob)} bytes) is not in a layout this service "
                          "can write (a quantised KV cache type?)")


def _parse(blob: bytes, head: int, ext: bool) -> Layout:
    streams, cells = struct.unpack_from("<II", blob, head)
    if streams != 1 or cells != 1:
        raise LayoutError(f"{streams} streams of {cells} cells, not one of one")
    at = head + 8 + (24 if ext else 12)  # pos, n_seq_id, [x, y, tok], seq_id
    v_trans, layers = struct.unpack_from("<II", blob, at)
    at += 8
    k_types, v_types = set(), set()
    for _ in range(layers):
        k_type, row = struct.unpack_from("<iQ", blob, at)
        k_types.add(k_type)
        at += 12 + row
    for _ in range(layers):
        if v_trans:
            v_type, size, width = struct.unpack_from("<iII", blob, at)
            at += 12 + size * width
        else:
            v_type, row = struct.unpack_from("<iQ", blob, at)
            at += 12 + row
        v_types.add(v_type)
    if at != len(blob) or v_trans not in (0, 1) or len(k_types) != 1 or len(v_types) != 1:
        raise LayoutError("not this layout")
    (k_type,), (v_type,) = k_types, v_types
    if k_type not in GGML_TYPES or v_type not in GGML_TYPES:
        raise LayoutError("not this layout")
    return Layout(layers, k_type, v_type, bool(v_trans), ext, blob[:head])


def sequence_state(layout: Layout, prompt: Prompt, keys: list[np.ndarray], values: list[np.ndarray],
                   n: int | None = None) -> bytes:
    """The KV of ``prompt``'s first ``n`` tokens (default: all) as llama.cpp's serialised sequence: ``keys`` and
    ``values`` one (n, width) array per layer."""
    n = len(prompt.ids) if n is None else n
    if len(keys) != layout.layers or any(k.shape[0] != n for k in (*keys, *values)):
        raise LayoutError(f"{len(keys)} layers of KV for {n} tokens do not fit a model of {layout.layers} layers")
    fields = [("pos", "<i4"), ("n_seq", "<u4")] + ([("x", "<i4"), ("y", "<i4"), ("tok", "<i4")] if layout.ext
                                                   else []) + [("seq", "<i4")]
    cells = np.zeros(n, np.dtype(fields))
    cells["pos"], cells["n_seq"] = prompt.positions[0, :n], 1
    if layout.ext:
        cells["y"], cells["x"] = prompt.positions[1, :n], prompt.positions[2, :n]
        cells["tok"] = prompt.ids[:n]
        for start, image, _ in prompt.images:
            cells["tok"][start:min(start + image.tokens, n)] = NO_TOKEN
    parts = [layout.head, struct.pack("<II", 1, n), cells.tobytes(),
             struct.pack("<II", int(layout.v_trans), layout.layers)]
    for k in keys:
        data = np.ascontiguousarray(k, dtype=layout.k_dtype)
        parts += [struct.pack("<iQ", layout.k_type, data[0].nbytes), data.tobytes()]
    for v in values:
        data = np.ascontiguousarray(v.T if layout.v_trans else v, dtype=layout.v_dtype)
        head = (struct.pack("<iII", layout.v_type, data.itemsize, v.shape[1]) if layout.v_trans
                else struct.pack("<iQ", layout.v_type, data[0].nbytes))
        parts += [head, data.tobytes()]
    return b"".join(parts)


class OpenVINOPrefill:
    """The artifact's OpenVINO language model, computing new prompts into llama.cpp's serialised form."""

    def __init__(self, settings, model_dir: Path, layout: Layout):
        # llama.cpp's cache is f16: a u8 cache (the plugin's default) would add its rounding, and kv reads none.
        self._lm = PagedLM(settings, model_dir, kv_precision="f32" if settings.kv_precision == "f32" else "f16")
        self.layout = layout

    @staticmethod
    def worth(tokens: int, keep: int) -> bool:
        """Whether a prompt of ``tokens`` whose first ``keep`` llama.cpp already holds is computed here, from its
        first token (OpenVINO holds no conversation), rather than its rest on llama.cpp: when the rest is long
        and the kept part short next to it (recomputing it here costs less than llama.cpp computing the rest)."""
        return tokens - keep >= MIN_TOKENS and keep <= (tokens - keep) // 2

    def feed(self, prompt: Prompt, chunk: int) -> Iterator[bytes | None]:
        """All of ``prompt`` but its last token, at most ``chunk`` tokens per call: None after each call but the
        last, then their KV as llama.cpp's serialised sequence. The last token is llama.cpp's to compute, so every
        token is drawn from llama.cpp's logits: a prompt asked again, continued from this KV, gives the same answer.
        The state is emptied before and after (one abandoned half-way, its request gone, is emptied by the next)."""
        seq, n = self._lm.scratch(), len(prompt.ids) - 1
        for out in self._lm.feed(seq, prompt, 0, chunk, n):
            if out is None:
                yield None
                continue
            state = sequence_state(self.layout, prompt, *self._lm.kv(seq), n)
            self._lm.reset()
            yield state

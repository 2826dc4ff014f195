"""Qwen3-VL's OpenVINO language model over a paged KV cache the service manages, so that one decode step computes
several conversations (the paged engine, service.engine.paged): the artifact's own language model, as the direct
engine runs it, but with service.engine.kept_sequences' sequences instead of one stateful request.

The exported model is stateful (one KV state per infer request). openvino's paged-attention transformation, the one
genai's ContinuousBatchingPipeline applies, turns it into a model that reads and writes the KV of many sequences in
caller-owned cache tensors of fixed-size blocks: each call takes the new tokens of every sequence in it, laid end to
end, with each sequence's tokens already cached (``past_lens``) and its block table. This module owns the tensors,
hands out blocks, and builds those inputs; prompt, images and sampling stay the direct engine's.

The vocabulary projection is computed for the last new token of each sequence only (``logit_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from service.engine.genai import split_properties
from service.engine.kept_sequences import KeptSequences, Sequence
from service.engine.prompt import Prompt, prompt_rows

CACHE_PREFIX = ("key_cache.", "value_cache.")


class PagedLM(KeptSequences):
    # Twice llama.cpp's: OpenVINO's step grows slowly with its rows (the bench's paged steps table), and a sequence
    # takes cache blocks only while it holds tokens, so more kept conversations cost no memory up front.
    sequences = 8
    context_setting = "VLFLEET_KV_CACHE_GB"
    runtime = "openvino"

    def __init__(self, settings, model_dir: Path, kv_precision: str | None = None):
        """``kv_precision``: the cache's element type instead of VLFLEET_KV_PRECISION's (auto: the plugin's u8);
        ``kv`` reads only an f16 or f32 cache."""
        import openvino as ov

        core = ov.Core()
        _, props = split_properties(settings)
        if kv_precision:
            props["KV_CACHE_PRECISION"] = kv_precision
        model = core.read_model(str(Path(model_dir) / "openvino_language_model.xml"))
        self._layers = _static(model.input("deepstack_visual_embeds").get_partial_shape()[0])
        self._hidden = model.input("inputs_embeds").get_partial_shape()[2].get_length()
        self.vocab_size = model.output("logits").get_partial_shape()[2].get_length()
        _paged(model)
        compiled = core.compile_model(model, settings.device, props)
        self._request = compiled.create_infer_request()
        self._embed = core.compile_model(str(Path(model_dir) / "openvino_text_embeddings_model.xml"),
                                         settings.device, props).create_infer_request()
        caches = [i for i in compiled.inputs if i.get_any_name().startswith(CACHE_PREFIX)]
        # Tokens per block: the caches' third dimension, less the rows of scales a u8 key cache quantised per
        # channel adds there (the values' per-token scales go in the last dimension).
        self.block_size = min(i.get_partial_shape()[2].get_length() for i in caches)
        per_block = sum(_block_bytes(i) for i in caches)
        self.n_blocks = max(2 * self.sequences, int(settings.kv_cache_gb * 2**30) // per_block)
        self._caches = {}  # by input name; uninitialised: only the blocks handed out take memory (zeroed, _grow)
        for i in caches:
            shape = [self.n_blocks, *(d.get_length() for d in list(i.get_partial_shape())[1:])]
            self._caches[i.get_any_name()] = ov.Tensor(i.get_element_type(), shape)
            self._request.set_tensor(i.get_any_name(), self._caches[i.get_any_name()])
        # A sequence's last block is partly empty: n_ctx leaves one block per sequence for it, so a claim the
        # token count allows always finds its blocks.
        self.n_ctx = (self.n_blocks - self.sequences) * self.block_size
        self._init_sequences()
        self._free = list(range(self.n_blocks))

    def reset(self) -> None:
        self._forget_all()
        self._free = list(range(self.n_blocks))

    def feed(self, s: Sequence, prompt: Prompt, keep: int, chunk: int,
             end: int | None = None) -> Iterator[np.ndarray | None]:
        """KeptSequences.feed, up to ``end`` (default: all of the prompt)."""
        n = len(prompt.ids) if end is None else end
        for a in range(keep, n, chunk):
            b = min(a + chunk, n)
            logits, _ = self.feed_beside(s, prompt, a, b, [])
            yield logits if b == n else None

    def feed_beside(self, s: Sequence, prompt: Prompt, a: int, b: int,
                    steps: list[tuple[Sequence, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Prompt tokens a..b into ``s`` and one decode step of ``steps`` (other sequences) in one call: the logits
        after token b - 1, and the steps' (len(steps), vocab). A step's few rows ride along a chunk's matmuls
        almost free, where a call of their own reads every weight again (ops.bench.paged_steps' fused rows)."""
        self._grow(s, b)
        embeds, mask, deepstack = prompt_rows(self._embed, prompt, a, b)
        positions = prompt.positions[:, a:b]
        if steps:
            step_embeds, step_positions = self._step_rows(steps)
            embeds = np.concatenate([embeds, step_embeds])
            positions = np.concatenate([positions, step_positions], axis=1)
            mask = np.concatenate([mask, np.zeros(len(steps), bool)])
        logits = self._infer([(s, b - a)] + [(q, 1) for q, _, _ in steps], embeds, positions, mask, deepstack)
        self._kept(s, prompt, a, b)
        self._stepped(steps)
        return logits[0], logits[1:]

    def kv(self, s: Sequence) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The keys and values ``s`` holds, one (tokens, kv heads x head size) array per layer, in layer order
        (service.engine.kv_handoff hands them to llama.cpp). Blocks are (kv heads, block size, head size)."""
        n, found = len(s.keys), {}
        for name, cache in self._caches.items():
            if cache.get_element_type().bitwidth < 16:
                raise ValueError(f"{name} is {cache.get_element_type()}: kv reads an f16 or f32 cache")
            blocks = cache.data[s.blocks]  # (blocks, kv heads, block size, head size)
            found[name] = blocks.transpose(0, 2, 1, 3).reshape(-1, blocks.shape[1] * blocks.shape[3])[:n]
        layers = range(len(found) // 2)
        return [found[f"{CACHE_PREFIX[0]}{i}"] for i in layers], [found[f"{CACHE_PREFIX[1]}{i}"] for i in layers]

    def step_many(self, steps: list[tuple[Sequence, int, int]]) -> np.ndarray:
        embeds, positions = self._step_rows(steps)
        logits = self._infer([(s, 1) for s, _, _ in steps], embeds, positions, np.zeros(len(steps), bool), [])
        self._stepped(steps)
        return logits

    def _step_rows(self, steps: list[tuple[Sequence, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """The embeddings and positions of a decode step's tokens, each sequence given room for its token."""
        for s, _, _ in steps:
            self._grow(s, len(s.keys) + 1)
        embeds = self._embed.infer({"input": np.array([[t for _, t, _ in steps]], np.int64)})[0][0]
        positions = np.tile(np.array([p for _, _, p in steps], np.int64), (3, 1))  # text: the three rows together
        return embeds, positions

    def _infer(self, rows: list[tuple[Sequence, int]], embeds: np.ndarray, positions: np.ndarray,
               mask: np.ndarray, deepstack: list) -> np.ndarray:
        """One call for ``rows`` (sequence, its new tokens' count; their tokens laid end to end in ``embeds``):
        the logits after each sequence's last new token, (len(rows), vocab)."""
        total = len(embeds)
        past = np.array([len(s.keys) for s, _ in rows], np.int32)
        lens = np.array([n for _, n in rows], np.int32)
        ends = np.cumsum(lens)
        # With no image token in the call the exported graph still gathers one row per position: give it zeros.
        ds = (np.concatenate(deepstack, axis=1) if deepstack
              else np.zeros((self._layers, total, self._hidden), np.float32))
        out = self._request.infer({
            "inputs_embeds": embeds, "position_ids": positions, "visual_pos_masks": mask[None],
            "deepstack_visual_embeds": ds, "past_lens": past,
            "subsequence_begins": np.concatenate([[0], ends]).astype(np.int32),
            "block_indices": np.concatenate([s.blocks for s, _ in rows]).astype(np.int32),
            "block_indices_begins": np.cumsum([0] + [len(s.blocks) for s, _ in rows]).astype(np.int32),
            "max_context_len": np.array((past + lens).max(), np.int32),
            "logit_rows": (ends - 1).astype(np.int64)})
        return np.array(out["logits"][:, 0])

    def _grow(self, s: Sequence, tokens: int) -> None:
        """Blocks enough for ``s`` to hold ``tokens``."""
        need = -(-tokens // self.block_size) - len(s.blocks)
        if need > len(self._free):
            raise MemoryError(f"the KV cache ({self.n_blocks} blocks of {self.block_size} tokens) is full: "
                              f"raise {self.context_setting}")
        for _ in range(need):
            block = self._free.pop()
            for cache in self._caches.values():
                cache.data[block] = 0
            s.blocks.append(block)

    def _cut_kv(self, s: Sequence, length: int) -> None:
        keep = -(-length // self.block_size)
        self._free.extend(s.blocks[keep:])
        del s.blocks[keep:]


def _static(dim) -> int:
    return 0 if dim.is_dynamic else dim.get_length()


def _block_bytes(port) -> int:
    shape = port.get_partial_shape()
    return int(np.prod([shape[k].get_length() for k in range(1, len(shape))])) * port.get_element_type().bitwidth // 8


def _paged(model) -> None:
    """The paged-attention form of the model, with the vocabulary projection for the rows ``logit_rows`` names
    (one per sequence: its last new token) instead of every new token."""
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import paged_attention_transformation

    paged_attention_transformation(model)
    head = model.output("logits").get_node().input_value(0).get_node()
    while head.get_type_name() != "MatMul":
        head = head.input_value(0).get_node()
    rows = ops.parameter([-1], ov.Type.i64, name="logit_rows")
    rows.output(0).get_tensor().set_names({"logit_rows"})
    picked = ops.gather(head.input_value(0), rows, ops.constant(np.int64(0)))
    head.input(0).replace_source_output(picked.output(0))
    model.add_parameters([rows])
    model.validate_nodes_and_infer_types()

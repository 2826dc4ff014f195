"""The artifact's language model in its exported stateful form (one KV state per infer request, OpenVINO's SDPA):
the reference the paged form's logits are compared with. The service ran it as the direct engine's language model
until the paged form replaced it (docs/engines.md, "Paged attention, not the exported SDPA")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from service.engine.prompt import Prompt, common_prefix, prompt_rows


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

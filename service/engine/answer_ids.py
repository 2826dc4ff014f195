"""The token ids each answer was generated as, found again when a client sends the answer back in a follow-up.

A follow-up's prompt is rendered from text, and an answer's text does not always tokenize back into the tokens it
was generated as: a model need not produce the tokenizer's own split of a text (the synthetic model never does, a
real one sometimes). The engines that keep a conversation's KV (direct, hybrid, paged) hold the generated tokens,
so a follow-up tokenized from text alone shares its prompt with them only up to the first such difference and
computes the rest of the answer again. So each answer's prompt text and answer text are remembered with the ids
they were computed as; a prompt that starts with one takes those ids and tokenizes only what follows.

What follows an answer in a rendered prompt starts with the template's end-of-turn token, a special token: the
tokenizer never merges across it, so the rest tokenizes as it would inside the whole text.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

END_OF_TURN = "<|im_end|>"  # Qwen's chat template closes every turn, an answer's too, with this token
CAPACITY = 64  # answers remembered, used longest ago forgotten first (as many as the session store keeps)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class AnswerIds:
    """Touched by the inference thread only."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._ids: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def remember(self, text: str, ids: np.ndarray) -> None:
        """``text`` (a prompt and its answer's text) was computed as ``ids``."""
        key = _digest(text)
        self._ids[key] = ids
        self._ids.move_to_end(key)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def encode(self, text: str, encode: Callable[[str], np.ndarray]) -> np.ndarray:
        """``text`` as token ids: its longest remembered prefix (one that ends where a turn does) as it was computed,
        the rest by ``encode``."""
        cut = len(text)
        while (cut := text.rfind(END_OF_TURN, 0, cut)) > 0:
            key = _digest(text[:cut])
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return np.concatenate([ids, encode(text[cut:])])
        return encode(text)

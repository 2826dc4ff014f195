"""Several conversations' KV kept side by side in one cache, for a language model that steps them in one batch
(service.engine.llama_lm's llama.cpp sequences, service.engine.paged_lm's OpenVINO paged cache).

A prompt goes to the sequence whose kept tokens share the longest prefix with it (image tokens compared by the
image's digest: service.engine.prompt), is cut back to that prefix, and only the rest is computed. When the cache has
no room for a prompt, the sequences used longest ago are forgotten first. A cut never falls inside an image: a prefix
that ends inside one keeps none of it (llama.cpp cuts by position, and all of an image's tokens share their first).

A subclass says how a sequence's KV is cut (``_cut_kv``), how a prompt is computed into it (``feed``) and how one
decode step of several is run (``step_many``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from service.engine.errors import APIError
from service.engine.prompt import Prompt, common_prefix

SEQUENCES = 4  # conversations whose KV is kept at once, in one shared cache of n_ctx tokens (a subclass may keep more)
SAME_CONVERSATION = 0.5  # the share of a sequence's tokens a prompt must start with to continue it


@dataclass
class Sequence:
    seq: int
    keys: list = field(default_factory=list)  # one per kept token (Prompt.keys)
    starts: list[int] = field(default_factory=list)  # each kept token's first M-RoPE position: what a cut is by
    used: float = 0.0
    busy: bool = False  # claimed by an answer being generated
    reserve: int = 0  # tokens kept free for it while busy: its prompt and longest answer
    blocks: list[int] = field(default_factory=list)  # the cache blocks holding its KV (a paged cache)


def segments(prompt: Prompt, keep: int):
    """(kind, start, end) runs of prompt tokens from ``keep`` on: "text" runs and "image" runs, in order."""
    cursor = keep
    for start, image, _ in prompt.images:
        end = start + image.tokens
        if end <= cursor:
            continue
        if start > cursor:
            yield "text", cursor, start
        yield "image", max(start, cursor), end
        cursor = end
    if cursor < len(prompt.ids):
        yield "text", cursor, len(prompt.ids)


class KeptSequences:
    """For one conversation at a time (DirectPipeline.generate): prefill, step, reset, keys, vocab_size; and, for
    several at once (the batched engines' loop, service.engine.hybrid), ``claim`` a sequence, ``feed`` its prompt
    in chunks, ``step_many`` one decode step for all, ``release`` it. Subclasses set ``n_ctx`` (tokens the cache
    holds), ``vocab_size`` and ``context_setting`` (the setting that makes the cache larger)."""

    sequences: int = SEQUENCES  # conversations kept, and the most a decode step takes
    n_ctx: int
    vocab_size: int
    context_setting: str
    runtime: str  # what computes prompts and steps: the inference log's prefill_on

    def _init_sequences(self) -> None:
        self._sequences = [Sequence(i) for i in range(self.sequences)]
        self._active = self._sequences[0]

    @property
    def keys(self) -> list:
        return self._active.keys

    def _forget_all(self) -> None:
        for s in self._sequences:
            s.keys, s.starts, s.blocks, s.busy, s.reserve = [], [], [], False, 0

    # --- what a subclass provides -----------------------------------------------------------------------------

    def feed(self, s: Sequence, prompt: Prompt, keep: int, chunk: int) -> Iterator[np.ndarray | None]:
        """Compute ``prompt`` after its first ``keep`` tokens into ``s``, at most ``chunk`` tokens per call;
        yields None after each call but the last, and the logits after the last."""
        raise NotImplementedError

    def step_many(self, steps: list[tuple[Sequence, int, int]]) -> np.ndarray:
        """One decode step: token of each (sequence, token, position) at its position; (len(steps), vocab) logits."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget every sequence's KV."""
        raise NotImplementedError

    def prefill_on(self, tokens: int, keep: int) -> str:
        """The runtime that computes a prompt of ``tokens`` whose first ``keep`` the sequence holds."""
        return self.runtime

    def _cut_kv(self, s: Sequence, length: int) -> None:
        """Drop the KV of ``s`` after its first ``length`` tokens (its keys are cut by the caller)."""
        raise NotImplementedError

    # --- one conversation at a time (DirectPipeline.generate) ------------------------------------------------

    def prefill(self, prompt: Prompt) -> tuple[np.ndarray, int]:
        s = self._choose(prompt.keys, self._sequences)
        self._active = s
        keep = self._keep(s, prompt)
        if not self._make_room(len(prompt.keys) - keep, s):
            raise self.too_long(len(prompt.ids))
        *_, logits = self.feed(s, prompt, keep, len(prompt.ids))
        return logits, keep

    def too_long(self, prompt_tokens: int, answer_tokens: int | None = None) -> APIError:
        """The 400 for a request the cache cannot hold even alone: a setting to raise, not a wait."""
        what = f"the prompt ({prompt_tokens} tokens)"
        if answer_tokens is not None:
            what += f" and its max_tokens ({answer_tokens})"
        fix = f"raise {self.context_setting}" + ("" if answer_tokens is None else ", or ask for fewer tokens")
        return APIError(f"{what} cannot fit in the language model's context of {self.n_ctx} tokens: {fix}",
                        400, code="context_length_exceeded")

    def scratch(self) -> Sequence:
        """Every sequence forgotten, the first one returned: for a caller that computes one prompt at a time and keeps
        nothing (service.engine.kv_handoff)."""
        self.reset()
        return self._sequences[0]

    def step(self, token: int, position: int) -> np.ndarray:
        self._make_room(1, self._active)
        return self.step_many([(self._active, token, position)])[0]

    # --- several at once (the batched engines) ----------------------------------------------------------------

    def claim(self, prompt: Prompt, answer_tokens: int) -> tuple[Sequence, int] | None:
        """A sequence for ``prompt`` and how many of its tokens it already holds, with room kept for the prompt and
        ``answer_tokens`` more; None while the busy sequences leave no such room (try again when one is released)."""
        idle = [s for s in self._sequences if not s.busy]
        if not idle:
            return None
        s = self._choose(prompt.keys, idle)
        keep = self._keep(s, prompt)
        s.busy, s.reserve = True, len(prompt.keys) + answer_tokens
        if self._make_room(0, s):
            return s, keep
        s.busy, s.reserve = False, 0
        return None

    def release(self, s: Sequence) -> None:
        s.busy, s.reserve = False, 0

    def forget(self, s: Sequence) -> None:
        """Release ``s`` with nothing kept."""
        self._cut(s, 0)
        self.release(s)

    def _kept(self, s: Sequence, prompt: Prompt, lo: int, hi: int) -> None:
        """Record that ``s`` now holds prompt tokens lo..hi."""
        s.keys.extend(prompt.keys[lo:hi])
        s.starts.extend(prompt.positions[0, lo:hi].tolist())

    @staticmethod
    def _stepped(steps: list[tuple[Sequence, int, int]]) -> None:
        for s, token, position in steps:
            s.keys.append(token)
            s.starts.append(position)

    # --- which sequence, what it keeps ------------------------------------------------------------------------

    @staticmethod
    def _choose(keys: tuple, among: list[Sequence]) -> Sequence:
        """The sequence this prompt continues: the one sharing the longest prefix with it, if that is at least
        SAME_CONVERSATION of what the sequence holds (a follow-up, a regenerated or edited last turn); otherwise an
        empty one, or the one used longest ago. Every conversation shares the chat template's first tokens, so a
        longest prefix alone would make each new conversation take over the last one's sequence."""
        shared = {s.seq: common_prefix(tuple(s.keys), keys) for s in among}
        best = max(among, key=lambda s: (shared[s.seq], s.used))
        if not best.keys or shared[best.seq] < SAME_CONVERSATION * len(best.keys):
            best = min(among, key=lambda s: (bool(s.keys), s.used))
        best.used = time.monotonic()
        return best

    def _keep(self, s: Sequence, prompt: Prompt) -> int:
        """Cut ``s`` back to what ``prompt`` shares with it (at least one token left to compute, never inside an
        image); how many tokens it keeps."""
        keep = min(common_prefix(tuple(s.keys), prompt.keys), len(prompt.keys) - 1)
        for start, image, _ in prompt.images:
            if start < keep < start + image.tokens:
                keep = start
        self._cut(s, keep)
        return keep

    def _cut(self, s: Sequence, length: int) -> None:
        if length < len(s.keys):
            self._cut_kv(s, length)
            del s.keys[length:], s.starts[length:]

    def _make_room(self, tokens: int, s: Sequence) -> bool:
        """Forget idle sequences, used longest ago first (never ``s``), until ``tokens`` more fit in the cache
        beside what the busy ones hold and have reserved; False if they cannot."""
        def used() -> int:
            return sum(max(len(o.keys), o.reserve) if o.busy else len(o.keys) for o in self._sequences)

        idle = sorted((o for o in self._sequences if o is not s and not o.busy and o.keys), key=lambda o: o.used)
        if used() - sum(len(o.keys) for o in idle) + tokens > self.n_ctx:
            return False  # not even with every idle one forgotten: forget none
        while idle and used() + tokens > self.n_ctx:
            self._cut(idle.pop(0), 0)
        return True

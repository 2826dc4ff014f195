"""Answers to identical deterministic requests, replayed from memory in the same SSE shape.

The key is a hash of the image hashes, the turns (and the session they continue), the generation parameters and
the artifact: never the image itself. Bounded by entries and bytes (LRU); requests that sample without a seed are
never cached.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from service.engine.conversation import Conversation, Sampling, Timings

ENTRY_OVERHEAD = 512  # bytes per entry beyond its text: key, lists, dataclass


@dataclass(frozen=True)
class CachedAnswer:
    pieces: tuple[str, ...]  # as streamed, so a replay looks like the original
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + sum(len(p.encode()) for p in self.pieces)

    def timings(self) -> Timings:
        """A replay's timings: no wait, no generation, the original's token counts."""
        return Timings(first_token_s=0.0, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


def cache_key(conversation: Conversation, sampling: Sampling, model_id: str) -> str | None:
    """None when the answer may legitimately differ next time (sampling without a seed), and for answers with
    logprobs: a cached answer keeps its text only, and its replay must not lack them."""
    if not sampling.deterministic or sampling.logprobs:
        return None
    turns = [[t.role, t.text, [img.digest for img in t.images], *([t.tool_calls] if t.tool_calls else [])]
             for t in conversation.turns]
    fmt = sampling.response_format
    params = [sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed, list(sampling.stop),
              sampling.ignore_eos, None if fmt is None else [fmt.kind, fmt.schema]]
    # A web UI follow-up sends its new question alone: the session id (the content key of the turns it continues)
    # stands for the rest, or two sessions asking the same follow-up would share one answer.
    # The tools are part of the prompt (the template lists them); tool_choice is in the format (a forced call) or
    # only decides how the same text is returned (auto, none), so it keys nothing else.
    tools = [conversation.tools] if conversation.tools else []
    return hashlib.sha256(json.dumps([model_id, conversation.session, turns, params, *tools]).encode()).hexdigest()


class AnswerCache:
    def __init__(self, max_bytes: int, max_entries: int):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._entries: OrderedDict[str, CachedAnswer] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str | None) -> CachedAnswer | None:
        if key is None or not self.enabled:
            return None
        with self._lock:
            answer = self._entries.get(key)
            if answer is not None:
                self._entries.move_to_end(key)
            return answer

    def put(self, key: str | None, answer: CachedAnswer) -> None:
        if key is None or not self.enabled or answer.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.size
            self._entries[key] = answer
            self.bytes += answer.size
            while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, evicted = self._entries.popitem(last=False)
                self.bytes -= evicted.size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

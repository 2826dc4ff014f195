"""Conversations the engine can continue cheaply: a bounded LRU of OpenVINO GenAI chat histories.

A ChatHistory that VLMPipeline has generated from keeps its encoded images and the prompt it has seen,
so a follow-up appended to it skips the vision encoder and re-uses the cached prefix. Clients of the
stateless OpenAI API find theirs by content (the hash of the turns so far); the web UI sends that key back
as its session id.
Only the inference thread touches this store, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from service.conversation import Turn, content_key


@dataclass
class Session:
    history: Any  # openvino_genai.ChatHistory the pipeline has generated from
    turns: tuple[Turn, ...]  # what the history holds, for the content key
    reused: bool = False

    @property
    def key(self) -> str:
        return content_key(self.turns)


class SessionStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._by_key: OrderedDict[str, Session] = OrderedDict()

    def take(self, key: str) -> Session | None:
        """Remove and return the session whose turns hash to ``key``: it is about to grow a new turn."""
        return self._by_key.pop(key, None)

    def put(self, session: Session) -> None:
        self._by_key[session.key] = session
        self._by_key.move_to_end(session.key)
        while len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_key)

    def clear(self) -> None:
        self._by_key.clear()

"""Conversations the engine has answered: a bounded LRU of their turns (text, images, answers).

Every request is rendered whole into one prompt with its images tagged where they were sent; the pipeline's
prefix cache re-uses the KV blocks of the turns it has already seen, so a follow-up prefills only its new
tokens. The web UI sends just its new question and the session id it was given, and gets the earlier turns
from here; clients of the stateless OpenAI API re-send everything and are found by content (the hash of the
turns so far), which only tells metrics and the X-Session-Reused header that they continue a conversation.

Why not genai's ChatHistory: in 2026.4 its Qwen3-VL path adds the vision position embeddings to a history's
cached image in place, so each follow-up saw drifted image features and missed the prefix cache (measured).
Only the inference thread touches this store, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict

from service.engine.conversation import Conversation, Turn, content_key


class SessionStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        # Turns only for clients that continue by session id; the stateless API re-sends them, so only its key.
        self._by_key: OrderedDict[str, tuple[Turn, ...] | None] = OrderedDict()

    def resolve(self, conv: Conversation) -> tuple[Conversation, bool]:
        """The whole conversation ``conv`` continues, and whether it continues one answered here.

        An unknown or expired session id starts over from the new turn alone (the web UI re-sends its image).
        """
        if conv.session is None:
            return conv, len(conv.turns) > 1 and conv.prefix_key() in self._by_key
        earlier = self._by_key.get(conv.session)
        if earlier is None:
            return Conversation(conv.turns, by_session=True), False
        self._by_key.move_to_end(conv.session)
        last = conv.turns[-1]
        if any(turn.images for turn in earlier):  # the web UI re-sends the image the session already has
            last = Turn(last.role, last.text)
        return Conversation((*earlier, last), by_session=True), True

    def remember(self, conv: Conversation, answer: str) -> str:
        """Store ``conv`` with its answer; returns the session id a follow-up names."""
        turns = (*conv.turns, Turn("assistant", answer))
        key = content_key(turns)
        self._by_key[key] = turns if conv.by_session else None
        self._by_key.move_to_end(key)
        while len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)
        return key

    def __len__(self) -> int:
        return len(self._by_key)

    def clear(self) -> None:
        self._by_key.clear()

"""Streamed text from generated token ids, as soon as each piece of it is complete.

Qwen's tokenizer is byte-level BPE: the text of ``a + b`` is the text of ``a`` followed by that of ``b`` whenever
``a`` ends on a whole UTF-8 character. So only an incomplete character is held back. genai's TextStreamer holds
back the last 3 tokens instead (for tokenizers whose cleanup rewrites earlier text), which costs 2 decode steps of
first-token latency: about 0.2 s with the 2b model on 2 cores.

With the tokenizer's byte table (service.engine.logprobs.TokenBytes) a piece that is whole UTF-8 is joined from its
tokens' bytes: genai's decode runs its detokenizer model, an OpenVINO inference per token whose threads wake on cores
busy with the decode; a test keeps the two equal. Anything else (a character still incomplete, bytes that are not
UTF-8, an id the table lacks) is genai's to decode, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from service.engine.logprobs import TokenBytes

INCOMPLETE = "\ufffd"  # what the detokenizer gives for a partial UTF-8 sequence


class IncrementalDecoder:
    """``push(ids)`` returns the new text ("" while a character is incomplete); ``flush()`` the rest."""

    def __init__(self, tokenizer, token_bytes: TokenBytes | None = None):
        self._tokenizer, self._bytes = tokenizer, token_bytes
        self._pending: list[int] = []  # ids since the last complete character: decoding stays O(1) per token

    def push(self, ids: Iterable[int]) -> str:
        self._pending.extend(int(i) for i in ids)
        text = joined(self._bytes, self._pending) if self._bytes is not None else None
        if text is None:
            text = self._tokenizer.decode(self._pending)
            if text.endswith(INCOMPLETE):
                return ""
        self._pending.clear()
        return text

    def flush(self) -> str:
        text = self._tokenizer.decode(self._pending) if self._pending else ""
        self._pending.clear()
        return text


def joined(table: TokenBytes, ids: list[int]) -> str | None:
    """The text of ``ids`` from the byte table, special tokens left out as genai's decode does; None unless every id
    is in the table and their bytes are whole UTF-8."""
    if not all(i in table for i in ids):
        return None
    try:
        return b"".join(table(i) for i in ids if i not in table.special).decode()
    except UnicodeDecodeError:
        return None


def token_streamer(tokenizer, on_text: Callable[[str], Any]):
    """A genai streamer that calls ``on_text`` with each complete piece of text; its status is on_text's."""
    import openvino_genai as ov_genai

    class _Streamer(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self._decoder = IncrementalDecoder(tokenizer)

        def write(self, token):
            text = self._decoder.push(token if isinstance(token, list) else [token])
            return on_text(text) if text else ov_genai.StreamingStatus.RUNNING

        def end(self):
            text = self._decoder.flush()
            if text:
                on_text(text)

    return _Streamer()

"""Structured output for an engine that samples itself (the direct engine): a response format compiled by
llguidance into a matcher over the artifact's own tokenizer (its tokenizer.json), which gives the set of tokens
allowed at each step. The sampler sees the language model's logits with every other token at -inf, so the answer is
constrained while it is generated, and an end-of-sequence token is allowed only where the grammar accepts.

Compiled grammars are kept per format (LRU): a repeated schema costs a copy of the kept matcher. A schema llguidance
cannot compile (an unimplemented keyword, an unknown format, a dangling $ref) is the client's 400, naming what
llguidance names, raised before any token is generated.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from service.engine.conversation import ResponseFormat
from service.engine.errors import APIError
from service.engine.genai import CALL_CLOSE, CALL_OPEN, SCHEMA_PARAM, TOOLS_PARAM, schema_text

# One JSON layout: no free whitespace (with a model that rambles, a run of spaces or newlines could fill the whole
# token budget), the separators json.dumps writes.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CAPACITY = 128  # compiled formats kept
_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


class Grammars:
    """The token table of one artifact's tokenizer (built on first use) and its compiled formats. Thread-safe: the
    request threads compile at submit, the inference thread takes a copy."""

    def __init__(self, model_dir: Path, vocab_size: int, eos: tuple[int, ...], capacity: int = CAPACITY):
        self._tokenizer_json = Path(model_dir) / "tokenizer.json"
        self.vocab_size, self._eos, self._capacity = vocab_size, list(eos), capacity
        self._tokenizer = None
        self._added: dict[str, int] | None = None
        self._compiled: OrderedDict[ResponseFormat, object] = OrderedDict()
        self._lock = threading.RLock()
        self.compiles = 0  # formats compiled (not taken from the cache)

    def _llg_tokenizer(self):
        import llguidance

        if self._tokenizer is None:
            try:
                text = self._tokenizer_json.read_text()
            except OSError as e:
                raise APIError(f"response_format needs the artifact's tokenizer.json ({e})", 500,
                               param="response_format", code="structured_output_unavailable") from None
            self._tokenizer = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self._eos)
        return self._tokenizer

    def _added_tokens(self) -> dict[str, int]:
        """The tokenizer's added tokens by text (read with the token table, so the file was there)."""
        self._llg_tokenizer()
        if self._added is None:
            spec = json.loads(self._tokenizer_json.read_text())
            self._added = {t["content"]: t["id"] for t in spec.get("added_tokens", ())}
        return self._added

    def compiled(self, fmt: ResponseFormat):
        """The kept matcher of ``fmt`` (compiled now if it is not kept), or a 400 naming what cannot be compiled.
        Never consume tokens with it: ``constraint`` gives each answer its own copy."""
        import llguidance

        with self._lock:
            matcher = self._compiled.get(fmt)
            if matcher is not None:
                self._compiled.move_to_end(fmt)
                return matcher
            tokenizer = self._llg_tokenizer()
            param = TOOLS_PARAM if fmt.kind == "tool_call" else SCHEMA_PARAM
            try:
                grammar = _grammar(fmt, self._added_tokens())
            except ValueError as e:  # not a JSON object at all
                raise _unsupported(str(e), param) from None
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
            if is_error:
                raise _unsupported("; ".join(messages), param)
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            if matcher.is_error():
                raise _unsupported(matcher.get_error(), param)
            self.compiles += 1
            self._compiled[fmt] = matcher
            while len(self._compiled) > self._capacity:
                self._compiled.popitem(last=False)
            return matcher

    def constraint(self, fmt: ResponseFormat) -> Constraint:
        with self._lock:  # the kept matcher is only ever copied, one thread at a time
            return Constraint(self.compiled(fmt).deep_copy(), self.vocab_size)


def _grammar(fmt: ResponseFormat, added: dict[str, int]) -> str:
    """llguidance's grammar of a format: its JSON schema, or a forced tool call as Lark, the tags around the call
    object's schema (%json, with the same JSON layout through the schema's x-guidance options).

    A tag the tokenizer has as an added token (Qwen's <tool_call>, </tool_call>) is that token (<[id]>), as the
    model writes it: llguidance keeps added tokens apart from text, so the literal "<tool_call>" in the grammar would
    allow the token in the mask and then refuse it when consumed (measured: "token doesn't satisfy the grammar")."""
    import llguidance

    if fmt.kind != "tool_call":
        return llguidance.LLMatcher.grammar_from_json_schema(schema_text(fmt), defaults=JSON_OPTIONS)

    def tag(text: str) -> str:
        return " ".join(f"<[{added[t]}]>" if t in added else json.dumps(t) for t in re.split(r"(</?tool_call>)", text)
                        if t)

    schema = {**json.loads(fmt.schema), "x-guidance": JSON_OPTIONS}
    lark = f"start: {tag(CALL_OPEN)} call {tag(CALL_CLOSE)}\ncall: %json {json.dumps(schema)}"
    return llguidance.LLMatcher.grammar_from_lark(lark)


def _unsupported(reason: str, param: str = SCHEMA_PARAM) -> APIError:
    return APIError(f"'{param}' cannot be enforced: {reason}", 400, param=param, code="unsupported_schema")


class Constraint:
    """One answer's matcher: ``mask`` the logits before sampling, ``consume`` the sampled token."""

    def __init__(self, matcher, vocab_size: int):
        self._matcher = matcher
        self._vocab = vocab_size
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # llguidance's bitmask: bit i = token i

    @property
    def stopped(self) -> bool:
        """The grammar is complete and takes nothing more: only the end of the answer is left."""
        return self._matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """(vocabulary,) bool: the tokens the grammar allows next."""
        return self._bitmask().view(bool)

    def mask(self, logits: np.ndarray, forbid: tuple[int, ...] = ()) -> np.ndarray:
        """``logits`` (modified) with every token the grammar does not allow (and those of ``forbid``) pushed to the
        float32 minimum: no sampler picks them, and their probability is 0.

        Branch-free arithmetic (bits -> 0 / -1 -> 0 / -max, added): boolean indexing, np.where and np.putmask
        branch on every token and cost up to ten times more when the allowed tokens are scattered."""
        if len(logits) != self._vocab:
            raise ValueError(f"{len(logits)} logits for a grammar over {self._vocab} tokens")
        bias = self._bitmask().astype(np.float32)
        bias -= 1
        bias *= _FLOAT32_MAX
        logits += bias
        if forbid:
            logits[list(forbid)] = -np.inf
        return logits

    def _bitmask(self) -> np.ndarray:
        """(vocabulary,) uint8, 1 where allowed: llguidance writes one bit per token into ``_bits``."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._check()
        return np.unpackbits(self._bits.view(np.uint8), count=self._vocab, bitorder="little")

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            self._check()
            raise RuntimeError(f"the grammar refused token {token} it allowed")

    def _check(self) -> None:
        if self._matcher.is_error():
            raise RuntimeError(f"structured output: {self._matcher.get_error()}")


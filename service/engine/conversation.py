"""What the engine generates from: a conversation of text turns with images, independent of the HTTP API."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from service.engine.images import PreparedImage

ROLES = ("system", "user", "assistant", "tool")

# The runtime's image/video placeholders: the engine tags images itself, so a text may not carry one.
# ASCII digits spelled out: the same regex in the API's JSON Schema (ECMA-262) means the same strings.
RESERVED_TAG_PATTERN = r"<ov_genai_(?:image|video)_[0-9]+>"
_RESERVED_TAG = re.compile(RESERVED_TAG_PATTERN)


def reserved_tag(text: str) -> str | None:
    """The first runtime placeholder in ``text``, if any."""
    found = _RESERVED_TAG.search(text)
    return found.group(0) if found else None


@dataclass(frozen=True)
class Turn:
    role: str
    text: str
    images: tuple[PreparedImage, ...] = ()
    # an assistant turn's calls as compact JSON text (service.http.tools), for the template
    tool_calls: str | None = None


@dataclass(frozen=True)
class ResponseFormat:
    """What the answer must be, enforced while it is generated (not checked afterwards): any JSON object
    (``json_object``), or JSON valid against ``schema`` (``json_schema``)."""

    # "json_object" | "json_schema" | "tool_call" (service.http.tools: <tool_call>{name, arguments}</tool_call>)
    kind: str
    schema: str | None = None  # the JSON Schema as compact JSON text in the client's key order (the order the
    # answer's properties come out in, so two orders are two answers), hashable

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema", "tool_call") or \
                (self.kind != "json_object") != (self.schema is not None):
            raise ValueError(f"bad response format {self.kind!r} (schema given: {self.schema is not None})")


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: fixed output length from a model whose answers are noise
    response_format: ResponseFormat | None = None  # None: free text
    logprobs: bool = False  # each token's logprob on its Token event (service.engine.logprobs)
    top_logprobs: int = 0  # and this many most likely tokens at its step

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    session: str | None = None  # explicit session id (web UI); None = derive from content
    by_session: bool = False  # the client continues by session id (web UI), so the server keeps its turns
    tools: str | None = None  # the request's function tools as compact JSON text: the template lists them

    def __post_init__(self) -> None:
        if not self.turns or self.turns[-1].role not in ("user", "tool"):
            raise ValueError("a conversation must end with a user turn (or a tool's result)")

    @property
    def images(self) -> list[PreparedImage]:
        return [img for turn in self.turns for img in turn.images]

    def prefix_key(self) -> str:
        """Content key of everything before the last user turn: a follow-up finds its earlier turns by it."""
        return content_key(self.turns[:-1])


def content_key(turns: tuple[Turn, ...] | list[Turn]) -> str:
    h = hashlib.sha256()
    for turn in turns:
        calls = [turn.tool_calls] if turn.tool_calls else []  # a turn without calls keys as before
        h.update(json.dumps([turn.role, turn.text, [img.digest for img in turn.images], *calls]).encode())
    return h.hexdigest()


@dataclass
class Timings:
    queued_s: float = 0.0
    first_token_s: float | None = None  # from the start of generation
    total_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    image_encode_s: float = 0.0
    reused_session: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def ms_per_token(self) -> float | None:
        if self.first_token_s is None or self.completion_tokens < 2:
            return None
        return 1000.0 * (self.total_s - self.first_token_s) / (self.completion_tokens - 1)

    def as_dict(self) -> dict:
        return {
            "queued_s": round(self.queued_s, 4),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 4),
            "total_s": round(self.total_s, 4),
            "ms_per_token": None if self.ms_per_token is None else round(self.ms_per_token, 2),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "image_encode_s": round(self.image_encode_s, 4),
            "reused_session": self.reused_session,
        }

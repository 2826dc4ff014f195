"""The HTTP API's answers, JSON and Server-Sent Events, declared for /openapi.json.

The handlers build the same keys; the API fuzz test checks every answer and every event against these.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    # Documented as sent; keys may be added later (not ErrorDetail's), so clients ignore keys they do not know.
    pass


class ErrorDetail(Answer):
    """Exactly these four keys (OpenAI's), on every error and in /chat's error event."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, description="what went wrong and what to change")
    type: str = Field(description="invalid_request_error, authentication_error, rate_limit_error or server_error")
    param: str | None = Field(description="the request field at fault, as a path (messages[0].content)")
    code: str | None = Field(description="a stable, machine-readable reason")


class Error(Answer):
    """Every 4xx and 5xx answer, in OpenAI's shape."""

    error: ErrorDetail


class AssistantAnswer(Answer):
    role: Literal["assistant"]
    content: str


class TopLogprob(Answer):
    token: str = Field(description="the token's text (U+FFFD where it holds part of a character)")
    logprob: float = Field(le=0)
    bytes: list[int] = Field(description="the token's UTF-8 bytes: a whole answer's concatenate to its text")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the top_logprobs most likely tokens at this step, most "
                                                       "likely first")


class ChoiceLogprobs(Answer):
    content: list[TokenLogprob] = Field(description="one entry per answer token (in a chunk: its delta's)")
    refusal: None = None


LOGPROBS = "with logprobs: true only (service.engine.logprobs)"


class Choice(Answer):
    index: int
    message: AssistantAnswer
    logprobs: ChoiceLogprobs | None = Field(None, description=LOGPROBS)
    finish_reason: Literal["stop", "length"]


class Usage(Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(Answer):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Model(Answer):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    artifact_id: str | None = Field(description="the converted artifact's content id (manifest.json)")


class ModelList(Answer):
    object: Literal["list"]
    data: list[Model]


class Liveness(Answer):
    status: Literal["alive"]


class Readiness(Answer):
    ready: bool
    model: str
    artifact_id: str | None
    release_id: str | None
    engine: str = Field(description="the engine serving (VLFLEET_ENGINE): serial, batching, direct or llamacpp")
    queue_depth: int
    uptime_s: float
    load_seconds: float | None
    reason: str | None = Field(None, description="why not ready (present only then)")
    failed: bool | None = Field(None, description="with a reason: true when the engine gave up (a model that failed "
                                "to load, a runtime that died while loading): it will not turn ready until the "
                                "service is restarted, so stop waiting; false while it may still turn ready")


class Delta(Answer):
    role: Literal["assistant"] | None = Field(None, description="in the first chunk only")
    content: str | None = None


class ChunkChoice(Answer):
    index: int = Field(description="the choice (n): each choice's chunks in turn, its first with the role")
    delta: Delta
    logprobs: ChoiceLogprobs | None = Field(None, description=LOGPROBS)
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionChunk(Answer):
    """One event of a streamed completion; with stream_options.include_usage the last has usage and no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ChatStatus(Answer):
    """/chat's first event: what the model does before its first token."""

    status: str = Field(description="encoding image, or reading the conversation")
    reused_session: bool = Field(description="the prefix cache held the conversation's earlier turns")


class ChatToken(Answer):
    text: str = Field(description="the next piece of the answer")


class Timings(Answer):
    queued_s: float
    first_token_s: float | None = Field(description="from the start of generation")
    total_s: float
    ms_per_token: float | None
    prompt_tokens: int
    completion_tokens: int
    image_encode_s: float
    reused_session: bool
    request_first_token_s: float | None = Field(None, description="the first token as the request saw it, "
                                                                 "queueing included")


class ChatDone(Answer):
    finish_reason: Literal["stop", "length", "cancelled"]
    session: str | None = Field(description="send it back as 'session' to continue this conversation")
    timings: Timings

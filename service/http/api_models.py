"""The HTTP API's requests, declared once: these models validate every request and generate /openapi.json.

Rules JSON Schema can state live on the types (service.http.api_types and below): a user's text is not blank, a
system message comes first only, stream_options need stream. The one it cannot (the last message is the user's) is
the validator ``_conversation``. Image bytes, the model's name and the image count depend on the server, so
service.http.openai_request checks those after these models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Json, model_validator
from pydantic.json_schema import SkipJsonSchema

from service.http.api_tools import Tool, ToolCall, ToolChoice, ToolMessage
from service.http.api_types import Shape, Text, integer, leave_out, matching, only, prompt, refuse, str_or_list

CONTENT = "must be a string or a non-empty list of content parts"
# A user message asks something: its text is not blank (so no message is empty: a list holds a part at least).
UserText = prompt("is blank; ask a question (or send the image part alone)")


class TextPart(Shape):
    type: Literal["text"]
    text: Text


class UserTextPart(Shape):
    type: Literal["text"]
    text: UserText


class ImageURL(Shape):
    url: matching(r"^(data:|[Hh][Tt][Tt][Pp][Ss]?://)", "invalid_image_url", "must be a data: URL like "
                  "'data:image/png;base64,...' (or an http(s) URL from an allowed domain)",
                  description="data:image/...;base64,... (http(s) only from VLFLEET_IMAGE_URL_DOMAINS)")
    detail: Literal["auto", "low", "high"] | None = Field(
        None, description="the image's token budget: low scales its long side to VLFLEET_IMAGE_MAX_SIDE_LOW (scene "
                          "questions), high to VLFLEET_IMAGE_MAX_SIDE_HIGH (reading text), auto (the default) to "
                          "VLFLEET_IMAGE_MAX_SIDE")


class ImagePart(Shape):
    type: Literal["image_url"]
    image_url: ImageURL


def _text_only(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "image_url":
        raise refuse("invalid_value", "is an image: images are only allowed in user messages")
    return part


UserPart = Annotated[UserTextPart | ImagePart, Field(discriminator="type")]
OtherPart = Annotated[TextPart, BeforeValidator(_text_only)]


class UserMessage(Shape):
    role: Literal["user"]
    content: str_or_list(UserText, UserPart, CONTENT, min_length=1)
    name: str | None = None


class SystemMessage(Shape):
    role: Literal["system"]
    content: str_or_list(Text, OtherPart, CONTENT, min_length=1)
    name: str | None = None


class AssistantMessage(Shape):
    role: Literal["assistant"]
    content: str_or_list(Text, OtherPart, CONTENT, min_length=1) | None = Field(
        None, description="null (or left out) only with tool_calls")
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = Field(None, description="the calls this "
                                                                                                "answer made")

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise refuse("invalid_value", "an assistant message needs 'content' or 'tool_calls'", "content")
        return self


AnyMessage = UserMessage | SystemMessage | AssistantMessage | ToolMessage


def images(message: AnyMessage) -> list[tuple[int, ImageURL]]:
    """Each image of ``message`` with its index in the content (for the error's param)."""
    if not isinstance(message.content, list):
        return []
    return [(j, p.image_url) for j, p in enumerate(message.content) if isinstance(p, ImagePart)]


def text(message: AnyMessage) -> str:
    if message.content is None:  # an assistant's tool calls alone
        return ""
    if isinstance(message.content, str):
        return message.content
    return "\n".join(p.text for p in message.content if p.type == "text")


def _conversation(messages: list[AnyMessage]) -> list[AnyMessage]:
    """What JSON Schema cannot say of a list: the last message is the user's (or a tool's result)."""
    for i, message in enumerate(messages[1:], 1):  # the schema says this one too (prefixItems, items)
        if message.role == "system":
            raise refuse("invalid_value", f"messages[{i}] has role 'system': a system message may only come first",
                         f"messages[{i}].role")
    last = len(messages) - 1
    if messages[last].role not in ("user", "tool"):
        raise refuse("invalid_value", f"the last message (messages[{last}]) must have role 'user' (or 'tool')",
                     f"messages[{last}].role")
    return messages


def _system_first(schema: dict) -> None:
    """'A system message comes first only' in JSON Schema: item 0 may be any message, the rest any but system."""
    anyone = schema["items"]
    mapping = {role: ref for role, ref in anyone["discriminator"]["mapping"].items() if role != "system"}
    schema["prefixItems"] = [anyone]
    schema["items"] = {"oneOf": [{"$ref": ref} for ref in mapping.values()],
                       "discriminator": {"propertyName": "role", "mapping": mapping}}


Messages = Annotated[list[Annotated[AnyMessage, Field(discriminator="role")]],
                     Field(min_length=1, json_schema_extra=_system_first,
                           description="the conversation, oldest first: a system message only first, the user's "
                                       "last (or a tool's result: role tool answers an assistant's tool_calls); "
                                       "images in user messages only"),
                     AfterValidator(_conversation)]
Count = integer(ge=1, le=2**31)
NonEmpty = Annotated[str, Field(min_length=1)]
Penalty = only(float, 0, "is not supported; leave it out or set 0")
MAX_CHOICES = 8  # n: each choice is a generation of its own (service.http.choices), so a request asks for a few at most


class StreamOptions(Shape):
    include_usage: bool = Field(False, description="a last chunk with usage and no choices")
    continuous_usage_stats: bool = Field(False, description="accepted and ignored (vLLM's option)")


class TextFormat(Shape):
    type: Literal["text"] = Field(description="plain text: the same as no response_format")


class JSONObjectFormat(Shape):
    type: Literal["json_object"] = Field(description="the answer is one JSON object (constrained while generated)")


class JSONSchema(Shape):
    name: matching(r"^[A-Za-z0-9_-]{1,64}$", "invalid_value", "must be 1 to 64 letters, digits, '_' or '-'",
                   description="the format's name (not sent to the model)")
    schema_: Annotated[dict[str, Any], Field(alias="schema", description="the JSON Schema the answer follows")]
    strict: bool | None = Field(None, description="accepted: the answer always follows the schema")
    description: str | None = Field(None, description="accepted and not sent to the model")


class JSONSchemaFormat(Shape):
    type: Literal["json_schema"] = Field(description="the answer follows json_schema.schema (constrained while "
                                                     "generated)")
    json_schema: JSONSchema


ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")]


def _stream_options_need_stream(schema: dict) -> None:
    schema["if"] = {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]}
    schema["then"] = {"properties": {"stream": {"const": True}}, "required": ["stream"]}
    schema["dependentSchemas"] = {"top_logprobs": {"properties": {"logprobs": {"const": True}},
                                                   "required": ["logprobs"]}}


class ChatCompletionRequest(Shape):
    """POST /v1/chat/completions. OpenAI fields that would change the answer and are not implemented (functions,
    logit_bias, ...) are refused by name, not ignored."""

    model_config = ConfigDict(json_schema_extra=_stream_options_need_stream)

    model: str | None = Field(None, description="the served model's id (GET /v1/models); default: that model")
    messages: Messages
    stream: bool = Field(False, description="answer as Server-Sent Events of chat.completion.chunk")
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    max_tokens: Count | None = Field(None, description="capped at the server's VLFLEET_MAX_TOKENS (its default)")
    max_completion_tokens: Count | None = Field(None, description="max_tokens' newer name; wins over it")
    temperature: Annotated[float, Field(ge=0, le=2)] | None = Field(None, description="0 (default): greedy")
    top_p: Annotated[float, Field(ge=0.0001, le=1)] | None = Field(None, description="nucleus sampling; default 1")
    seed: integer(ge=0, le=2**63 - 1) | None = Field(None, description="sampled answers repeat")
    stop: str_or_list(NonEmpty, NonEmpty, "must be a non-empty string or a list of up to 4 non-empty strings",
                      max_length=4) | None = Field(None, description="generation stops at any of these")
    n: integer(ge=1, le=MAX_CHOICES) | None = Field(
        None, description="choices to generate (default 1); each is an answer of its own: side by side on the batching "
                          "engine, one after another on the others; with a seed, choice i samples with seed + i")
    logprobs: bool | None = Field(None, description="each answer token's logprob (choices[].logprobs.content); an "
                                                    "engine that cannot give them refuses (400, naming those that can)")
    top_logprobs: integer(ge=0, le=20) | None = Field(None, description="only with logprobs: true: the most likely "
                                                                       "tokens at each step, with their logprobs")
    user: str | None = Field(None, description="accepted and ignored")
    frequency_penalty: Penalty | None = Field(None, description="0 only")
    presence_penalty: Penalty | None = Field(None, description="0 only")
    ignore_eos: bool = Field(False, description="benchmarks: always generate max_tokens")
    tools: list[Tool] | None = Field(None, description="function tools, listed to the model in Qwen3-VL's own "
                                                       "tools block; a call comes back as message.tool_calls")
    tool_choice: ToolChoice | None = Field(None, description="auto (default with tools): the model may call one; "
                                                             "none: no call; required or a named function: the "
                                                             "answer is one call, constrained to the tool's "
                                                             "parameters while generated")
    response_format: ResponseFormat | None = Field(
        None, description="json_object or json_schema: the answer is constrained to it while it is generated; an "
                          "engine that cannot constrain it refuses it (400, naming the engines that can); text: "
                          "no constraint")

    @model_validator(mode="after")
    def _stream_options_only_when_streaming(self) -> ChatCompletionRequest:
        """Declared to JSON Schema as if/then (``_stream_options_need_stream``)."""
        if self.stream_options is not None and not self.stream:
            raise refuse("invalid_value", "'stream_options' is only allowed with stream: true", "stream_options")
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        """Declared to JSON Schema as dependentSchemas (``_stream_options_need_stream``); as OpenAI."""
        if self.top_logprobs is not None and not self.logprobs:
            raise refuse("invalid_value", "'top_logprobs' is only allowed with logprobs: true", "top_logprobs")
        return self


class ChatForm(Shape):
    """POST /chat (multipart/form-data; the web UI): an image, a session to continue, or both. A file input left
    empty (no file name, as browsers send it) counts as no image."""

    model_config = ConfigDict(strict=False, json_schema_extra={"anyOf": [{"required": ["image"]},
                                                                        {"required": ["session"]}]})

    question: prompt("is empty; type a question about the image", form=True)
    image: bytes | SkipJsonSchema[None] = leave_out("JPEG, PNG, WebP, GIF or BMP; optional when continuing a session")
    session: NonEmpty | SkipJsonSchema[None] = leave_out("the session of the previous done event: continue that "
                                                         "conversation (its image need not be sent again)")
    max_tokens: Count | SkipJsonSchema[None] = leave_out("capped at the server's VLFLEET_MAX_TOKENS (its default)")
    detail: Literal["auto", "low", "high"] | SkipJsonSchema[None] = leave_out(
        "the image's token budget, as image_url.detail of /v1/chat/completions (default auto)")
    response_format: Json[ResponseFormat] | SkipJsonSchema[None] = leave_out(
        "the JSON text of /v1/chat/completions' response_format (json_object or json_schema): the answer is "
        "constrained to it while it is generated")

    @model_validator(mode="after")
    def _image_or_session(self) -> ChatForm:
        """Declared to JSON Schema as anyOf (required image, required session)."""
        if self.image is None and self.session is None:
            raise refuse("missing_image", "attach an image (field 'image') or continue a conversation (field "
                         "'session')", "image")
        return self

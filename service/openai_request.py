"""Parse and validate an OpenAI chat-completions request body into a Conversation and Sampling.

Everything a client can get wrong becomes an APIError naming the field (``param``) and the fix. Fields
that would change the meaning of the answer and that we do not implement are refused, not ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.conversation import ROLES, Conversation, Sampling, Turn, reserved_tag
from service.errors import APIError
from service.images import PreparedImage

KNOWN = {
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "seed", "stop", "n", "user", "frequency_penalty", "presence_penalty", "ignore_eos",
}
# Real OpenAI fields we do not implement; each would change the answer, so it is refused with this reason.
UNSUPPORTED = {
    "tools": "tool calling is not supported by this server",
    "tool_choice": "tool calling is not supported by this server",
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
    "response_format": "structured output (response_format) is not supported by this server",
    "logprobs": "logprobs are not supported by this server",
    "top_logprobs": "logprobs are not supported by this server",
    "logit_bias": "logit_bias is not supported by this server",
    "audio": "audio output is not supported by this server",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported by this server",
}


@dataclass(frozen=True)
class ChatRequest:
    conversation: Conversation
    sampling: Sampling
    stream: bool
    include_usage: bool
    model: str


def _fail(message: str, param: str, code: str = "invalid_value", status: int = 400) -> APIError:
    return APIError(message, status=status, param=param, code=code)


def _number(body: dict, name: str, lo: float, hi: float, default: float, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise _fail(f"'{name}' must be {'an integer' if integer else 'a number'}", name, "invalid_type")
    if not lo <= value <= hi:
        raise _fail(f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise _fail("'stop' must be a non-empty string or a list of up to 4 non-empty strings", "stop")
    return tuple(stop)


def parse(body: Any, model_name: str, max_tokens_cap: int, max_images: int,
          load_image: Callable[[str, str], PreparedImage]) -> ChatRequest:
    """``load_image(url, param)`` turns an image_url into a PreparedImage (or raises APIError)."""
    if not isinstance(body, dict):
        raise _fail("request body must be a JSON object", "body", "invalid_json")
    for name, reason in UNSUPPORTED.items():
        if body.get(name) not in (None, False, [], {}):
            raise _fail(f"'{name}': {reason}", name, "unsupported_parameter")
    unknown = sorted(set(body) - KNOWN - set(UNSUPPORTED))
    if unknown:
        raise _fail(f"unknown field(s): {', '.join(unknown)}", unknown[0], "unknown_parameter")
    model = body.get("model", model_name)
    if model != model_name:
        raise APIError(f"model '{model}' is not served here; use '{model_name}' (see /v1/models)", 404,
                       param="model", code="model_not_found")
    if _number(body, "n", 1, 1_000_000, 1, integer=True) != 1:
        raise _fail("'n' must be 1: one choice per request is supported", "n", "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, -2, 2, 0) != 0:
            raise _fail(f"'{name}' is not supported; leave it out or set 0", name, "unsupported_parameter")

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _fail("'stream' must be true or false", "stream", "invalid_type")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _fail("'stream_options' is only allowed with stream: true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
            raise _fail("'stream_options' may only contain include_usage", "stream_options")
        include_usage = bool(options.get("include_usage", False))

    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    requested = _number({param: limit}, param, 1, 1 << 31, max_tokens_cap, integer=True)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _fail("'ignore_eos' must be true or false", "ignore_eos", "invalid_type")
    sampling = Sampling(
        max_tokens=min(requested, max_tokens_cap),
        temperature=float(_number(body, "temperature", 0, 2, 0.0)),
        top_p=float(_number(body, "top_p", 0.0001, 1, 1.0)),
        seed=_number(body, "seed", 0, 2**63 - 1, None, integer=True),
        stop=_stop(body),
        ignore_eos=ignore_eos,
    )
    turns = _turns(body.get("messages"), max_images, load_image)
    return ChatRequest(Conversation(turns), sampling, stream, include_usage, model_name)


def _turns(messages: Any, max_images: int, load_image) -> tuple[Turn, ...]:
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list of {role, content} objects", "messages", "invalid_type")
    turns: list[Turn] = []
    images = 0
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _fail(f"{param} must be an object with 'role' and 'content'", param, "invalid_type")
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise _fail(f"{param} has unsupported field(s): {', '.join(sorted(extra))}", param, "unknown_parameter")
        role = message.get("role")
        if role not in ROLES:
            raise _fail(f"{param}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{param}.role")
        text, parts = _content(message.get("content"), f"{param}.content", role, load_image, max_images - images)
        images += len(parts)
        turns.append(Turn(role, text, tuple(parts)))
    if turns[-1].role != "user":
        raise _fail("the last message must have role 'user'", f"messages[{len(turns) - 1}].role")
    if any(t.role == "system" for t in turns[1:]):
        raise _fail("a 'system' message may only come first", "messages")
    last = turns[-1]
    if not last.text.strip() and not last.images:
        raise _fail("the last user message is empty; ask a question or attach an image",
                    f"messages[{len(turns) - 1}].content", "empty_prompt")
    return tuple(turns)


def _content(content: Any, param: str, role: str, load_image, images_left: int) -> tuple[str, list[PreparedImage]]:
    if isinstance(content, str):
        return _text(content, param), []
    if not isinstance(content, list) or not content:
        raise _fail(f"{param} must be a string or a non-empty list of content parts", param, "invalid_type")
    texts: list[str] = []
    images: list[PreparedImage] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _fail(f"{where}.text must be a string", f"{where}.text", "invalid_type")
            texts.append(_text(part["text"], f"{where}.text"))
        elif kind == "image_url":
            if role != "user":
                raise _fail(f"{where}: images are only allowed in user messages", where)
            if len(images) >= images_left:
                raise _fail("too many images in this request; the limit is set by VLFLEET_MAX_IMAGES", where,
                            "too_many_images")
            spec = part.get("image_url")
            url = spec.get("url") if isinstance(spec, dict) else spec
            if not isinstance(url, str) or not url:
                raise _fail(f"{where}.image_url.url must be a data: URL string", f"{where}.image_url", "invalid_type")
            images.append(load_image(url, f"{where}.image_url"))
        else:
            raise _fail(f"{where}.type must be 'text' or 'image_url', got {kind!r}", f"{where}.type")
    return "\n".join(texts), images


def _text(text: str, param: str) -> str:
    tag = reserved_tag(text)
    if tag:
        raise _fail(f"{param} contains {tag}, a placeholder reserved for the runtime; send images as image_url "
                    "parts", param, "reserved_tag")
    return text

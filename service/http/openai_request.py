"""An OpenAI chat-completions request body as the engine's Conversation and Sampling.

The body's shape is service.http.api_models.ChatCompletionRequest (the same model /openapi.json documents). What depends
on this server is checked here, after it: the model's name, the number of images and the images themselves.
Every refusal is an APIError naming the field (``param``) and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service.engine import constraining_engines, logprob_engines
from service.engine.conversation import Conversation, ResponseFormat, Sampling, Turn
from service.engine.errors import APIError
from service.engine.images import PreparedImage
from service.http import tools as tool_calls
from service.http.api_models import ChatCompletionRequest, ChatForm, JSONObjectFormat, JSONSchemaFormat, images, text
from service.http.request_errors import api_error

# Real OpenAI fields we do not implement; each would change the answer, so it is refused with this reason
# (null, false and empty values mean "not used" and pass).
UNSUPPORTED = {
    "functions": "function calling is not supported by this server",
    "function_call": "function calling is not supported by this server",
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
    n: int = 1  # choices: one job each (service.http.choices)
    tool_calls: bool = False  # the answer's <tool_call> blocks are parsed into tool_calls (service.http.tools)


def parse(body: Any, model_name: str, max_tokens_cap: int, max_images: int,
          load_image: Callable[[str, str, str | None], PreparedImage]) -> ChatRequest:
    """``load_image(url, param, detail)`` turns an image_url into a PreparedImage (or raises APIError)."""
    request = validate(body)
    if request.model not in (None, model_name):
        raise APIError(f"model '{request.model}' is not served here; use '{model_name}' (see /v1/models)", 404,
                       param="model", code="model_not_found")
    tools = tool_calls.of_request(request)
    tool_calls.check_history(request.messages)
    limit = request.max_completion_tokens or request.max_tokens or max_tokens_cap
    sampling = Sampling(
        max_tokens=min(limit, max_tokens_cap),
        temperature=float(request.temperature or 0.0),
        top_p=float(1.0 if request.top_p is None else request.top_p),
        seed=request.seed,
        stop=(request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ()),
        ignore_eos=request.ignore_eos,
        response_format=tools.forced or response_format(request),
        logprobs=bool(request.logprobs),
        top_logprobs=request.top_logprobs or 0,
    )
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    turns = _turns(request, max_images, load_image)
    return ChatRequest(Conversation(turns, tools=tools.listed), sampling, request.stream, include_usage, model_name,
                       request.n or 1, tool_calls=tools.parse)


def response_format(request: ChatCompletionRequest | ChatForm) -> ResponseFormat | None:
    """The request's response_format as the engines take it: None for text (or none), else its kind and, for
    json_schema, the schema as canonical JSON (the same schema always makes the same answer-cache key)."""
    match request.response_format:
        case JSONObjectFormat():
            return ResponseFormat("json_object")
        case JSONSchemaFormat(json_schema=spec):
            # the client's key order: it is the order the answer's properties come out in
            return ResponseFormat("json_schema", json.dumps(spec.schema_, separators=(",", ":")))
    return None


def require_constraining(fmt: ResponseFormat | None, engine: Any, engine_name: str) -> None:
    """A response_format this host's engine cannot enforce is refused (400), not ignored."""
    if fmt is not None and not engine.constrains_output:
        raise APIError(f"'response_format' ({fmt.kind}) is not supported by this host's engine ({engine_name}): it "
                       f"cannot constrain the answer, and does not ignore the request; the engines that do: "
                       f"{', '.join(constraining_engines())} (VLFLEET_ENGINE)",
                       param="response_format", code="unsupported_parameter")


def validate(body: Any) -> ChatCompletionRequest:
    """``body`` as a ChatCompletionRequest, or the APIError that says what to fix first."""
    if not isinstance(body, dict):
        raise APIError("request body must be a JSON object", param="body", code="invalid_json")
    for name, reason in UNSUPPORTED.items():
        if body.get(name) not in (None, False, [], {}):
            raise APIError(f"'{name}': {reason}", param=name, code="unsupported_parameter")
    fields = {k: v for k, v in body.items() if k not in UNSUPPORTED}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:
        raise api_error(e, fields) from None


def _turns(request: ChatCompletionRequest, max_images: int, load_image) -> tuple[Turn, ...]:
    count = sum(len(images(m)) for m in request.messages)
    if count > max_images:
        raise APIError(f"{count} images in this request; the limit is {max_images} (VLFLEET_MAX_IMAGES)",
                       param="messages", code="too_many_images")
    turns = []
    for i, message in enumerate(request.messages):
        loaded = [load_image(image.url, f"messages[{i}].content[{j}].image_url", image.detail)
                  for j, image in images(message)]
        turns.append(Turn(message.role, text(message), tuple(loaded), tool_calls.history_calls(message)))
    return tuple(turns)


def require_logprobs(sampling: Sampling, engine: Any, engine_name: str) -> None:
    """Logprobs this host's engine cannot give (``engine.top_logprobs``: the most top entries it computes, None for
    no logprobs at all) are refused (400), naming the engines that can."""
    limit = engine.top_logprobs
    if not sampling.logprobs or (limit is not None and sampling.top_logprobs <= limit):
        return
    field = "logprobs" if limit is None else "top_logprobs"
    what = "token logprobs" if limit is None else f"top_logprobs over {limit}"
    raise APIError(f"'{field}': {what} are not supported by this host's engine ({engine_name}); the engines that "
                   f"give them: {', '.join(logprob_engines(sampling.top_logprobs))} (VLFLEET_ENGINE)",
                   param=field, code="unsupported_parameter")

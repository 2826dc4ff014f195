"""OpenAI-compatible endpoints: POST /v1/chat/completions (streaming and not) and GET /v1/models."""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, g, jsonify, request

from service import openai_request, routing, sse, tools
from service.engine import Done, Event, Failed, Token, constraining_engines
from service.errors import APIError
from service.streaming import JobStream, sse_body

bp = Blueprint("openai", __name__)


def json_body():
    if request.mimetype != "application/json":
        raise APIError(f"Content-Type must be application/json, got {request.mimetype or 'none'}", 415,
                       code="unsupported_media_type")
    body = request.get_json(silent=True)
    if body is None:
        raise APIError("request body is not valid JSON", 400, code="invalid_json")
    return body


@bp.post("/v1/chat/completions")
def chat_completions():
    state = current_app.extensions["vlfleet"]
    settings = state.settings
    parsed = openai_request.parse(json_body(), settings.model_name, settings.max_tokens, settings.max_images,
                                  state.load_image)
    if parsed.sampling.response_format is not None and not state.engine.constrains_output:
        raise APIError(f"'response_format' ({parsed.sampling.response_format.kind}) is not supported by this "
                       f"host's engine ({settings.engine}): it cannot constrain the answer, and does not ignore the "
                       f"request; the engines that do: {', '.join(constraining_engines())} (VLFLEET_ENGINE)",
                       param="response_format", code="unsupported_parameter")
    job = state.engine.submit(parsed.conversation, parsed.sampling, g.request_id, routing.max_wait(request.headers))
    stream = JobStream(job, settings.queue_timeout, state.metrics, started_at=g.started_at)
    headers = stream.wait_started()
    completion_id = f"chatcmpl-{g.request_id}"
    created = int(time.time())
    if not parsed.stream:
        done = stream.collect()
        content, calls = tools.parse(done.text) if parsed.tool_calls else (done.text, [])
        message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        return jsonify({
            "id": completion_id, "object": "chat.completion", "created": created, "model": parsed.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else _finish(done.finish_reason)}],
            "usage": _usage(done.timings),
        }), 200, headers
    calls = tools.ToolStream() if parsed.tool_calls else None

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": parsed.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def render(event: Event) -> str | None:
        match event:
            case Token(text=text):
                return sse.event(chunk({"content": text})) if calls is None else _events(chunk, calls.push(text))
            case Failed(error=error):
                return sse.event(error.body()) + sse.event("[DONE]")
            case Done(finish_reason=reason, timings=timings):
                held = "" if calls is None else _events(chunk, calls.finish())
                out = held + sse.event(chunk({}, "tool_calls" if calls and calls.calls else _finish(reason)))
                if parsed.include_usage:
                    out += sse.event({**chunk({}), "choices": [], "usage": _usage(timings)})
                return out + sse.event("[DONE]")
        return None  # Started: the role chunk went out already

    def body():
        yield sse.event(chunk({"role": "assistant", "content": ""}))
        yield from sse_body(stream, render, sse.KEEPALIVE)

    return Response(body(), mimetype="text/event-stream", headers={**sse.HEADERS, **headers})


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _events(chunk, deltas: list[dict]) -> str:
    """SSE text of the deltas service.tools.ToolStream made of a piece (none while it holds text back)."""
    return "".join(sse.event(chunk(delta)) for delta in deltas)


def _usage(timings) -> dict:
    return {"prompt_tokens": timings.prompt_tokens, "completion_tokens": timings.completion_tokens,
            "total_tokens": timings.prompt_tokens + timings.completion_tokens}


@bp.get("/v1/models")
def models():
    state = current_app.extensions["vlfleet"]
    return jsonify({"object": "list", "data": [
        {"id": state.settings.model_name, "object": "model", "created": int(state.started_wall), "owned_by": "vlfleet",
         "artifact_id": state.artifact_id},
    ]})

"""OpenAI-compatible endpoints: POST /v1/chat/completions (streaming and not) and GET /v1/models."""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, g, jsonify, request

from service.engine import Done, Event, Failed, Started, Token, logprobs, routing
from service.engine.errors import APIError
from service.http import choices, openai_request, sse, tools
from service.http.streaming import JobStream

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
    openai_request.require_constraining(parsed.sampling.response_format, state.engine, settings.engine)
    openai_request.require_logprobs(parsed.sampling, state.engine, settings.engine)
    jobs = choices.submit(state.engine, parsed, g.request_id, routing.max_wait(request.headers))
    streams = [JobStream(job, settings.queue_timeout, state.metrics, started_at=g.started_at) for job in jobs]
    headers = choices.wait_started(streams)
    completion_id = f"chatcmpl-{g.request_id}"
    created = int(time.time())
    with_logprobs = parsed.sampling.logprobs
    if not parsed.stream:
        dones = choices.collect(streams)
        return jsonify({
            "id": completion_id, "object": "chat.completion", "created": created, "model": parsed.model,
            "choices": [{"index": i, **_answer(done, parsed.tool_calls),
                         **({"logprobs": logprobs.choice_logprobs(s.logprobs)} if with_logprobs else {})}
                        for i, (s, done) in enumerate(zip(streams, dones, strict=True))],
            "usage": choices.usage([done.timings for done in dones]),
        }), 200, headers
    # Each choice's tool-call parser (choices stream one after another, each from its first token to its Done).
    calls = [tools.ToolStream() for _ in streams] if parsed.tool_calls else None

    def chunk(delta: dict, finish: str | None = None, index: int = 0, entries=None) -> dict:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        if entries is not None:
            choice["logprobs"] = logprobs.choice_logprobs(entries)
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": parsed.model,
                "choices": [choice]}

    ended: list = []  # each choice's Timings, as it ends

    def render(index: int, event: Event) -> str | None:
        match event:
            case Started():
                return sse.event(chunk({"role": "assistant", "content": ""}, index=index))
            case Token(text=text, logprobs=entries):
                entries = entries if with_logprobs else None
                if calls is None:
                    return sse.event(chunk({"content": text}, index=index, entries=entries))
                return _events(chunk, calls[index].push(text), index)
            case Failed(error=error):
                return sse.event(error.body()) + sse.event("[DONE]")
            case Done(finish_reason=reason, timings=timings):
                ended.append(timings)
                held = "" if calls is None else _events(chunk, calls[index].finish(), index)
                called = calls is not None and bool(calls[index].calls)
                out = held + sse.event(chunk({}, "tool_calls" if called else _finish(reason), index))
                if index < len(streams) - 1:
                    return out
                if parsed.include_usage:
                    out += sse.event({**chunk({}), "choices": [], "usage": choices.usage(ended)})
                return out + sse.event("[DONE]")
        return None

    def body():
        yield from choices.sse_choices(streams, render, sse.KEEPALIVE)

    return Response(body(), mimetype="text/event-stream", headers={**sse.HEADERS, **headers})


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _answer(done: Done, parse_calls: bool) -> dict:
    """A whole choice's message and finish_reason: its <tool_call> blocks as tool_calls when the request had tools."""
    content, calls = tools.parse(done.text) if parse_calls else (done.text, [])
    message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return {"message": message, "finish_reason": "tool_calls" if calls else _finish(done.finish_reason)}


def _events(chunk, deltas: list[dict], index: int) -> str:
    """SSE text of the deltas service.http.tools.ToolStream made of a piece (none while it holds text back)."""
    return "".join(sse.event(chunk(delta, index=index)) for delta in deltas)


@bp.get("/v1/models")
def models():
    state = current_app.extensions["vlfleet"]
    return jsonify({"object": "list", "data": [
        {"id": state.settings.model_name, "object": "model", "created": int(state.started_wall), "owned_by": "vlfleet",
         "artifact_id": state.artifact_id},
    ]})

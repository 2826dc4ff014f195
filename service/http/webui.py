"""The web UI (GET /) and its simple streaming endpoint (POST /chat: multipart image + question)."""

from __future__ import annotations

import json

from flask import Blueprint, Response, current_app, g, request, send_from_directory
from pydantic import ValidationError

from service.engine import Done, Event, Failed, Started, Token, routing
from service.engine.conversation import Conversation, Sampling, Turn
from service.engine.errors import APIError
from service.engine.images import prepare
from service.http import openai_request, sse
from service.http.api_models import ChatForm
from service.http.request_errors import api_error
from service.http.streaming import JobStream, sse_body

bp = Blueprint("webui", __name__)


@bp.get("/")
def index():
    return send_from_directory(current_app.static_folder, "index.html", max_age=0)


@bp.post("/chat")
def chat():
    state = current_app.extensions["vlfleet"]
    settings = state.settings
    if request.mimetype != "multipart/form-data":
        raise APIError("POST /chat takes multipart/form-data with fields image (file), question and optional "
                       "session, detail, max_tokens, response_format", 415, code="unsupported_media_type")
    form = _form(settings.max_image_bytes)
    limits = state.image_limits[form.detail or "auto"]
    images = (prepare(form.image, limits, "image"),) if form.image is not None else ()
    sampling = Sampling(max_tokens=min(form.max_tokens or settings.max_tokens, settings.max_tokens),
                        response_format=openai_request.response_format(form))
    openai_request.require_constraining(sampling.response_format, state.engine, settings.engine)
    question, session = form.question.strip(), form.session
    conversation = Conversation((Turn("user", question, images),), session=session, by_session=True)
    job = state.engine.submit(conversation, sampling, g.request_id, routing.max_wait(request.headers))
    stream = JobStream(job, settings.queue_timeout,
                       state.metrics, started_at=g.started_at)
    headers = stream.wait_started()

    def render(event: Event) -> str | None:
        match event:
            case Token(text=text):
                return sse.event({"text": text}, "token")
            case Started(images=images, reused_session=reused):
                status = "encoding image" if images else "reading the conversation"
                return sse.event({"status": status, "reused_session": reused}, "status")
            case Failed(error=error):
                return sse.event(error.body()["error"], "error")
            case Done():
                return sse.event({"finish_reason": event.finish_reason, "session": event.session,
                                  "timings": _timings(event, stream)}, "done")
        return None

    return Response(sse_body(stream, render, sse.KEEPALIVE), mimetype="text/event-stream",
                    headers={**sse.HEADERS, **headers})


def _form(max_image_bytes: int) -> ChatForm:
    """The form as a ChatForm; a file input left empty (no file name, as browsers send it) is absent."""
    fields: dict = dict(request.form.items())
    for name, upload in request.files.items():
        if upload.filename != "":
            fields[name] = upload.read(max_image_bytes + 1) if name == "image" else upload
    try:
        return ChatForm.model_validate(fields)
    except ValidationError as e:
        raise api_error(e, _as_parsed(fields)) from None


def _as_parsed(fields: dict) -> dict:
    """``fields`` with response_format's JSON parsed, so an error inside it is named by its path there
    (response_format.json_schema.name), as on /v1/chat/completions."""
    try:
        return {**fields, "response_format": json.loads(fields["response_format"])}
    except (KeyError, TypeError, ValueError):
        return fields


def _timings(done: Done, stream: JobStream) -> dict:
    """The engine's timings plus the first token's delay as the request saw it (queueing included)."""
    timings = done.timings.as_dict()
    if stream.first_token_at is not None:
        timings["request_first_token_s"] = round(stream.first_token_at - stream.started_at, 4)
    return timings

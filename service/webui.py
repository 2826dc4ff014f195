"""The web UI (GET /) and its simple streaming endpoint (POST /chat: multipart image + question)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, request, send_from_directory

from service import sse
from service.conversation import Conversation, Sampling, Turn, reserved_tag
from service.engine import Done, Event, Failed, Started, Token
from service.errors import APIError
from service.images import prepare
from service.streaming import JobStream, sse_body

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
                       "session", 415, code="unsupported_media_type")
    question = (request.form.get("question") or "").strip()
    if not question:
        raise APIError("'question' is empty; type a question about the image", param="question", code="empty_prompt")
    if reserved_tag(question):
        raise APIError(f"'question' contains {reserved_tag(question)}, a placeholder reserved for the runtime; "
                       "attach the image as the 'image' file instead", param="question", code="reserved_tag")
    session = request.form.get("session") or None
    upload = request.files.get("image")
    images = ()
    if upload is not None and upload.filename != "":
        images = (prepare(upload.read(settings.max_image_bytes + 1), state.image_limits, "image"),)
    elif session is None:
        raise APIError("attach an image (field 'image') or continue a conversation (field 'session')",
                       param="image", code="missing_image")
    raw_max = request.form.get("max_tokens") or str(settings.max_tokens)
    if not raw_max.isdigit() or int(raw_max) < 1:
        raise APIError("'max_tokens' must be a positive integer", param="max_tokens")
    sampling = Sampling(max_tokens=min(int(raw_max), settings.max_tokens))
    conversation = Conversation((Turn("user", question, images),), session=session, by_session=True)
    stream = JobStream(state.engine.submit(conversation, sampling, g.request_id), settings.queue_timeout,
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


def _timings(done: Done, stream: JobStream) -> dict:
    """The engine's timings plus the first token's delay as the request saw it (queueing included)."""
    timings = done.timings.as_dict()
    if stream.first_token_at is not None:
        timings["request_first_token_s"] = round(stream.first_token_at - stream.started_at, 4)
    return timings

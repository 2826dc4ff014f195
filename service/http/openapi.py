"""The OpenAPI 3.1 document of every endpoint, served at GET /openapi.json and rendered to docs/api.md.

Its schemas are generated from the models that validate requests (service.http.api_models) and describe answers
(service.http.api_responses), so the document says what the server does; only the paths are written here.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from service.http import api_models, api_responses
from service.runtime import settings

bp = Blueprint("openapi", __name__)

REF = "#/components/schemas/{model}"
MODELS = (api_models.ChatCompletionRequest, api_models.ChatForm, api_responses.ChatCompletion,
          api_responses.ChatCompletionChunk, api_responses.ChatStatus, api_responses.ChatToken, api_responses.ChatDone,
          api_responses.ModelList, api_responses.Liveness, api_responses.Readiness, api_responses.Error)
# Image formats the service decodes (service.engine.images.FORMATS) as multipart media types.
IMAGE_TYPES = "image/png, image/jpeg, image/webp, image/gif, image/bmp"
DESCRIPTION = (
    "Qwen3-VL on OpenVINO GenAI: OpenAI-compatible chat completions with images, streamed over Server-Sent Events. "
    "For a follow-up, re-send the whole conversation (or, on /chat, name the session): the server's prefix cache "
    "re-uses the turns it has seen, so the follow-up's first token costs the image's vision pass and the new tokens "
    "only; the response header X-Session-Reused is 1 when it did.")


class _Generator(GenerateJsonSchema):
    """pydantic's generator without a title per field (the field's name again, noise in the docs)."""

    def field_title_should_be_set(self, schema) -> bool:
        return False


def schemas(model_name: str) -> dict:
    """components/schemas: every model and what it refers to; ``model`` names the model this server serves."""
    _, top = models_json_schema([(m, "validation") for m in MODELS], ref_template=REF, schema_generator=_Generator)
    found = top["$defs"]
    found["ChatCompletionRequest"]["properties"]["model"]["anyOf"][0]["enum"] = [model_name]
    return found


def _ref(name: str) -> dict:
    return {"$ref": REF.format(model=name)}


def _json(name: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: int) -> dict:
    return {str(code): _json("Error", "error") for code in codes}


def _json_data(*names: str) -> dict:
    """An event's data: JSON of one of the schemas ``names``."""
    refs = [_ref(name) for name in names]
    return {"type": "string", "contentMediaType": "application/json",
            "contentSchema": refs[0] if len(refs) == 1 else {"anyOf": refs}}


def _sse(description: str, event: dict) -> dict:
    """A text/event-stream whose ``schema`` is one event ({event, data}), as OpenAPI 3.1 tools read it."""
    return {"text/event-stream": {"schema": {"description": description, **event}}}


def _named(name: str, data: str) -> dict:
    return {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"const": name}, "data": _json_data(data)}}


COMPLETION_EVENT = {"type": "object", "required": ["data"], "properties": {
    "data": {"anyOf": [{"const": "[DONE]"}, _json_data("ChatCompletionChunk", "Error")]}}}
CHAT_EVENT = {"oneOf": [_named("status", "ChatStatus"), _named("token", "ChatToken"), _named("done", "ChatDone"),
                        _named("error", "ErrorDetail")]}


def _chat_completions() -> dict:
    return {"post": {
        "summary": "Chat completion with text and images (stream: true gives SSE chat.completion.chunk events)",
        "operationId": "createChatCompletion",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ChatCompletionRequest")}}},
        "responses": {"200": {"description": "completion, or an SSE stream ending with data: [DONE]", "content": {
            "application/json": {"schema": _ref("ChatCompletion")},
            **_sse("each event: data is a chat.completion.chunk (or an error), the last is [DONE]",
                   COMPLETION_EVENT)}},
            **_errors(400, 401, 403, 404, 413, 415, 429, 503)}}}


def _chat() -> dict:
    return {"post": {
        "summary": "Web UI endpoint: multipart image + question; SSE events status, token, done, error",
        "operationId": "chat",
        "requestBody": {"required": True, "content": {"multipart/form-data": {
            "schema": _ref("ChatForm"), "encoding": {"image": {"contentType": IMAGE_TYPES}}}}},
        "responses": {"200": {"description": "SSE stream", "content": _sse(
            "each event: status first, then token events, then done (or error)", CHAT_EVENT)},
                      **_errors(400, 401, 413, 415, 429, 503)}}}


def _get(operation_id: str, summary: str, responses: dict) -> dict:
    return {"get": {"summary": summary, "operationId": operation_id, "responses": responses}}


def _text(mime: str, description: str) -> dict:
    return {"description": description, "content": {mime: {"schema": {"type": "string"}}}}


def paths() -> dict:
    return {
        "/v1/chat/completions": _chat_completions(),
        "/chat": _chat(),
        "/v1/models": _get("listModels", "The model served", {"200": _json("ModelList"), **_errors(401)}),
        "/healthz": _get("healthz", "Liveness", {"200": _json("Liveness")}),
        "/readyz": _get("readyz", "Readiness: 200 when the model is loaded and warmed up",
                        {"200": _json("Readiness"), "503": _json("Readiness", "not ready, with the reason")}),
        "/metrics": _get("metrics", "Prometheus metrics",
                         {"200": _text("text/plain", "text exposition format"), **_errors(401)}),
        "/openapi.json": _get("openapi", "This document",
                              {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {
                                  "schema": {"type": "object"}}}}, **_errors(401)}),
        "/": _get("webui", "Web UI", {"200": _text("text/html", "HTML"), **_errors(401)}),
    }


def document(version: str, model_name: str | None = None) -> dict:
    """The whole document; ``model_name`` is the id this server accepts (default: VLFLEET_MODEL_NAME's default)."""
    model_name = model_name or next(f.default for f in settings.FIELDS if f.name == "model_name")
    return {
        "openapi": "3.1.0",
        "info": {"title": "vlfleet inference service", "version": version, "description": DESCRIPTION},
        "paths": paths(),
        "components": {
            "schemas": schemas(model_name),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "only when VLFLEET_API_KEYS_FILE is set"}},
        },
    }


@bp.get("/openapi.json")
def openapi():
    from service import __version__

    return jsonify(document(__version__, current_app.extensions["vlfleet"].settings.model_name))

"""The OpenAPI 3 description of every endpoint, served at GET /openapi.json."""

from __future__ import annotations

from flask import Blueprint, jsonify

bp = Blueprint("openapi", __name__)

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
TEXT_PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "additionalProperties": False, "properties": {
    "type": {"const": "image_url"},
    "image_url": {"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "description": "data:image/...;base64,... (http(s) only for allow-listed domains)"},
        "detail": {"type": "string"}}}}}
MESSAGE = {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
    "role": {"enum": ["system", "user", "assistant"]},
    "name": {"type": "string"},
    "content": {"oneOf": [{"type": "string"},
                          {"type": "array", "minItems": 1, "items": {"oneOf": [TEXT_PART, IMAGE_PART]}}]}}}
CHAT_REQUEST = {"type": "object", "required": ["messages"], "additionalProperties": False, "properties": {
    "model": {"type": "string"},
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1, "description": "capped at the server maximum"},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": "integer", "minimum": 0},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "n": {"const": 1},
    "user": {"type": "string"},
    "frequency_penalty": {"const": 0},
    "presence_penalty": {"const": 0},
    "ignore_eos": {"type": "boolean", "description": "benchmarks: always generate max_tokens"}}}
COMPLETION = {"type": "object", "required": ["id", "object", "choices", "usage"], "properties": {
    "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
    "model": {"type": "string"},
    "choices": {"type": "array", "items": {"type": "object", "properties": {
        "index": {"type": "integer"}, "finish_reason": {"enum": ["stop", "length"]},
        "message": {"type": "object", "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}}}}},
    "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                               "completion_tokens": {"type": "integer"},
                                               "total_tokens": {"type": "integer"}}}}}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": ERROR}}} for c in codes}


def _json(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(version: str) -> dict:
    obj = {"type": "object"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "vlfleet inference service", "version": version,
                 "description": "Qwen3-VL on OpenVINO GenAI: OpenAI-compatible chat completions with images, "
                                "streamed over Server-Sent Events. For a follow-up, re-send the whole conversation "
                                "(or, on /chat, name the session): the server's prefix cache re-uses the turns it has "
                                "seen, so the follow-up's first token costs the image's vision pass and the new "
                                "tokens only; the response header X-Session-Reused is 1 when it did."},
        "paths": {
            "/v1/chat/completions": {"post": {
                "summary": "Chat completion with text and images (stream: true gives SSE chat.completion.chunk events)",
                "operationId": "createChatCompletion",
                "requestBody": {"required": True, "content": {"application/json": {"schema": CHAT_REQUEST}}},
                "responses": {"200": {"description": "completion, or an SSE stream ending with data: [DONE]",
                                      "content": {"application/json": {"schema": COMPLETION},
                                                  "text/event-stream": {"schema": {"type": "string"}}}},
                              **_errors(400, 401, 403, 404, 413, 415, 429, 503)}}},
            "/chat": {"post": {
                "summary": "Web UI endpoint: multipart image + question; SSE events status, token, done, error",
                "operationId": "chat",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                    "type": "object", "required": ["question"], "properties": {
                        "image": {"type": "string", "format": "binary"}, "question": {"type": "string"},
                        "session": {"type": "string", "description": "the session of the previous done event: "
                                    "continue that conversation (its image need not be sent again)"},
                        "max_tokens": {"type": "integer", "minimum": 1}}}}}},
                "responses": {"200": {"description": "SSE stream",
                                      "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                              **_errors(400, 401, 413, 415, 429, 503)}}},
            "/v1/models": {"get": {"summary": "The model served", "operationId": "listModels",
                                   "responses": {"200": _json(obj), **_errors(401)}}},
            "/healthz": {"get": {"summary": "Liveness", "operationId": "healthz", "responses": {"200": _json(obj)}}},
            "/readyz": {"get": {"summary": "Readiness: 200 when the model is loaded and warmed up",
                                "operationId": "readyz",
                                "responses": {"200": _json(obj), "503": _json(obj, "not ready, with reason")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "operationId": "metrics", "responses": {
                "200": {"description": "text exposition format", "content": {"text/plain": {"schema": {
                    "type": "string"}}}}, **_errors(401)}}},
            "/openapi.json": {"get": {"summary": "This document", "operationId": "openapi",
                                      "responses": {"200": _json(obj)}}},
            "/": {"get": {"summary": "Web UI", "operationId": "webui", "responses": {
                "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        },
        "components": {
            "schemas": {"Error": ERROR, "ChatCompletionRequest": CHAT_REQUEST, "ChatCompletion": COMPLETION},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "only when VLFLEET_API_KEYS_FILE is set"}},
        },
    }


@bp.get("/openapi.json")
def openapi():
    from service import __version__

    return jsonify(document(__version__))

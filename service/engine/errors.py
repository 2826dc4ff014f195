"""Errors a client can cause, rendered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from flask import Flask, g, jsonify
from werkzeug.exceptions import HTTPException


class APIError(Exception):
    """An error with an HTTP status and a message that tells the client what to fix."""

    type = "invalid_request_error"

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = self.type if self.status < 500 or self.status == 503 else "server_error"
        if self.status == 429:
            kind = "rate_limit_error"
        elif self.status == 401:
            kind = "authentication_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class Overloaded(APIError):
    """A refusal for load: come back after ``retry_after`` s. ``reason`` labels it in the refusal counter (default:
    the status); the service counts it when it answers (service.http.app)."""

    def __init__(self, message: str, status: int, retry_after: int, reason: str | None = None):
        super().__init__(message, status, code="overloaded", headers={"Retry-After": str(retry_after)})
        self.reason = reason or str(status)


def register(app: Flask) -> None:
    @app.errorhandler(APIError)
    def _api_error(e: APIError):
        if isinstance(e, Overloaded):
            g.refusal_reason = e.reason
        response = jsonify(e.body())
        response.status_code = e.status
        response.headers.update(e.headers)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException):
        # Werkzeug's own 404/405/413/415 etc. get the same JSON shape instead of an HTML page.
        message = {
            404: "no such endpoint; see /openapi.json for the API",
            405: f"method not allowed here; allowed: {', '.join(sorted(e.valid_methods or []))}"
            if getattr(e, "valid_methods", None) else "method not allowed here",
            413: "request body too large; send a smaller image or raise VLFLEET_MAX_BODY_BYTES",
        }.get(e.code or 500, e.description or e.name)
        # Werkzeug's own headers stay (a 405's Allow lists the methods, as RFC 9110 asks).
        headers = {k: v for k, v in e.get_headers() if k.lower() != "content-type"}
        return _api_error(APIError(message, e.code or 500, code=(e.name or "error").lower().replace(" ", "_"),
                                   headers=headers))

    @app.errorhandler(Exception)
    def _unexpected(e: Exception):
        app.logger.exception("unhandled error")
        return _api_error(APIError("internal error; the request id is in the X-Request-Id header", 500,
                                   code="internal_error"))

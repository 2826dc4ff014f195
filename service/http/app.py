"""The Flask app factory: configuration, engine, blueprints, request ids, metrics and JSON errors."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, g, request

from service.engine import Engine, errors, make_engine, routing
from service.engine.images import ImageLimits
from service.http import auth, image_source
from service.runtime.memory_guard import MemoryGuard, cgroup_memory_high
from service.runtime.metrics import Metrics
from service.runtime.settings import Settings

log = logging.getLogger("vlfleet.http")


@dataclass
class State:
    """What the views share: one per app (one per process in production)."""

    settings: Settings
    engine: Engine
    metrics: Metrics
    image_limits: dict[str, ImageLimits]  # by OpenAI image detail: auto, low, high
    api_keys: tuple[bytes, ...]
    artifact_id: str | None
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    load_image: Any = None


def create_app(settings: Settings, pipeline_factory=None, start_engine: bool = True) -> Flask:
    """Build the app for ``settings``. ``pipeline_factory`` lets tests inject a pipeline that fails on purpose."""
    from service.http import api_openai, health, openapi, webui

    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    metrics = Metrics()
    limits = image_source.limits_by_detail(settings)
    artifact_id = _artifact_id(settings)
    limit_mb = settings.memory_limit_mb
    guard = MemoryGuard(limit_mb * 2**20 if limit_mb else cgroup_memory_high(), settings.memory_high_water,
                        settings.memory_low_water, metrics=metrics, system_high=settings.system_memory_high_water)
    engine = make_engine(settings, metrics, pipeline_factory, model_id=artifact_id or "", memory=guard)
    guard.on_trim = engine.trim
    state = State(settings, engine, metrics, limits, auth.load_keys(settings.api_keys_file), artifact_id)
    state.load_image = image_source.loader(settings)
    metrics.model.info({"model": settings.model_name, "artifact_id": state.artifact_id or "",
                        "release_id": settings.release_id, "model_dir": str(settings.model_dir)})
    app.extensions["vlfleet"] = state
    metrics.queue_capacity.set(settings.queue_size)
    metrics.start_time.set(state.started_wall)

    errors.register(app)
    for bp in (api_openai.bp, webui.bp, health.bp, openapi.bp):
        app.register_blueprint(bp)
    _instrument(app, state)
    if start_engine:
        guard.start()
        state.engine.start()
    return app


def _artifact_id(settings: Settings) -> str | None:
    import json

    try:
        return json.loads((settings.model_dir / "manifest.json").read_text()).get("artifact_id")
    except (OSError, ValueError):
        return None


def _instrument(app: Flask, state: State) -> None:
    @app.before_request
    def _begin():
        g.started_at = time.monotonic()
        g.request_id = request.headers.get("X-Request-Id", "")[:64] or uuid.uuid4().hex[:16]
        state.metrics.in_flight.inc()
        g.counted = True
        auth.check(state.api_keys, request.path, request.headers.get("Authorization"))

    @app.after_request
    def _finish(response):
        response.headers["X-Request-Id"] = g.get("request_id", "")
        response.headers["X-Served-By"] = routing.HOST
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        state.metrics.requests.labels(endpoint=endpoint, status=str(response.status_code)).inc()
        if response.status_code in (429, 503) and endpoint != "/readyz":
            reason = g.get("refusal_reason") or str(response.status_code)  # "wait": refused for the estimated wait
            state.metrics.rejected.labels(reason=reason).inc()
        if endpoint not in ("/metrics", "/healthz", "/readyz"):
            log.info("request", extra={"request_id": g.get("request_id"), "method": request.method,
                                       "path": request.path, "status": response.status_code,
                                       "ms": round(1000 * (time.monotonic() - g.get("started_at", 0)), 1)})
        return response

    @app.teardown_request
    def _teardown(_exc):
        if g.pop("counted", False):
            state.metrics.in_flight.dec()

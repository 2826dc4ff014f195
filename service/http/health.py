"""Liveness, readiness and metrics endpoints."""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """The process is alive and answering HTTP (says nothing about the model)."""
    return jsonify({"status": "alive"})


@bp.get("/readyz")
def readyz():
    """200 once the model is loaded and warmed up (and memory allows new work), else 503 with the reason;
    ``failed`` true when the engine gave up (it will not turn ready until the service is restarted)."""
    state = current_app.extensions["vlfleet"]
    engine = state.engine
    body = {
        "ready": engine.ready.is_set(),
        "model": state.settings.model_name,
        "artifact_id": state.artifact_id,
        "release_id": state.settings.release_id,
        "engine": state.settings.engine,
        "queue_depth": engine.queue_depth,
        "uptime_s": round(time.monotonic() - state.started, 1),
        "load_seconds": engine.load_seconds,
    }
    if engine.failed:
        body["reason"] = engine.failed
        body["failed"] = engine.gave_up
    elif not engine.ready.is_set():
        body["reason"] = "model loading"
    elif engine.memory is not None and engine.memory.shedding:
        body["ready"] = False
        body["reason"] = engine.memory.reason()
    return jsonify(body), 200 if body["ready"] else 503


@bp.get("/metrics")
def metrics():
    state = current_app.extensions["vlfleet"]
    state.metrics.ready.set(1 if state.engine.ready.is_set() else 0)
    return Response(generate_latest(state.metrics.registry), mimetype=CONTENT_TYPE_LATEST)

"""Bridge from an engine Job to an HTTP response: wait for the job to start, then stream its events.

Headers go out only once the job has started, so a full queue (429) or a queue timeout (503) is a real
HTTP status. After that, every event and a keep-alive comment each second are written; when the client
has gone, the write fails, the WSGI server closes the generator, and ``finally`` cancels the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from service.engine import KEEPALIVE, Job
from service.errors import APIError


class JobStream:
    def __init__(self, job: Job, queue_timeout: float, metrics=None, started_at: float | None = None):
        self.job = job
        self.metrics = metrics
        self.started_at = started_at or time.monotonic()
        self.first_token_at: float | None = None
        self._events = job.events(queue_timeout)
        self._head: list[tuple[str, Any]] = []
        self.started: dict = {}

    def wait_started(self) -> dict[str, str]:
        """Block until the job starts; raise its error (503 queue timeout, ...) if it fails instead.

        Returns response headers that describe the start (whether a cached conversation was continued).
        """
        for kind, payload in self._events:
            if (kind, payload) == KEEPALIVE:
                continue
            if kind == "error":
                raise payload
            if kind == "started":
                self.started = payload
            self._head.append((kind, payload))
            return {"X-Session-Reused": "1" if self.started.get("reused_session") else "0",
                    "X-Cache": self.started.get("cache", "miss")}
        raise APIError("job ended without events", 500)

    def events(self) -> Iterator[tuple[str, Any]]:
        """All events, the keep-alive ticks included; cancels the job if the consumer stops early."""
        try:
            for kind, payload in list(self._head):
                yield self._observe(kind, payload)
            self._head.clear()
            for kind, payload in self._events:
                yield self._observe(kind, payload)
        finally:
            self.job.cancel()

    def _observe(self, kind: str, payload: Any) -> tuple[str, Any]:
        if kind == "token" and self.first_token_at is None:
            self.first_token_at = time.monotonic()
            if self.metrics:
                self.metrics.ttft.observe(self.first_token_at - self.started_at)
        elif kind == "done" and self.metrics:
            timings = payload["timings"]
            self.metrics.duration.observe(time.monotonic() - self.started_at)
            self.metrics.generated_tokens.inc(timings.completion_tokens)
            self.metrics.prompt_tokens.inc(timings.prompt_tokens)
            self.metrics.image_encode.observe(timings.image_encode_s)
            if timings.reused_session:
                self.metrics.session_reuse.inc()
        return kind, payload

    def collect(self) -> dict:
        """For non-streaming responses: run to the end and return the done payload (or raise the error)."""
        for kind, payload in self.events():
            if kind == "error":
                raise payload
            if kind == "done":
                return payload
        raise APIError("job ended without a result", 500)


def sse_body(stream: JobStream, render: Callable[[str, Any], str | None], keepalive: str) -> Iterator[str]:
    """SSE text for every event: ``render`` maps an event to SSE text (None = send nothing)."""
    for kind, payload in stream.events():
        if (kind, payload) == KEEPALIVE:
            yield keepalive
            continue
        text = render(kind, payload)
        if text:
            yield text

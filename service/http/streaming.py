"""Bridge from an engine Job to an HTTP response: wait for the job to start, then stream its events.

Headers go out only once the job has started, so a full queue (429) or a queue timeout (503) is a real
HTTP status. After that, every event and a keep-alive comment each second are written; when the client
has gone, the write fails, the WSGI server closes the generator, and ``finally`` cancels the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from service.engine import KEEPALIVE, Done, Event, Failed, Job, Started, Token
from service.engine.conversation import Timings
from service.engine.errors import APIError
from service.engine.routing import reuse_headers


class JobStream:
    def __init__(self, job: Job, queue_timeout: float, metrics=None, started_at: float | None = None):
        self.job = job
        self.metrics = metrics
        self.started_at = started_at or time.monotonic()
        self.first_token_at: float | None = None
        self._events = job.events(queue_timeout)
        self._head: list[Event] = []
        self.started: Started | None = None
        self.logprobs: list[dict] = []  # every Token's logprob entries so far (a whole answer's choices[].logprobs)
        self.failed = False  # the job ended with Failed

    def wait_started(self) -> dict[str, str]:
        """Block until the job starts; raise its error (503 queue timeout, ...) if it fails instead.

        Returns response headers that describe the start: what the host reused (service.engine.routing).
        """
        for event in self._events:
            if event is KEEPALIVE:
                continue
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Started):
                self.started = event
            self._head.append(event)
            return reuse_headers(self.started, time.monotonic() - self.job.enqueued_at)
        raise APIError("job ended without events", 500)

    def events(self) -> Iterator[Event]:
        """All events, the keep-alive ticks included; cancels the job if the consumer stops early."""
        try:
            for event in list(self._head):
                yield self._observe(event)
            self._head.clear()
            for event in self._events:
                yield self._observe(event)
        finally:
            self.job.cancel()

    def _observe(self, event: Event) -> Event:
        if isinstance(event, Token):
            self.logprobs.extend(event.logprobs)
        if isinstance(event, Token) and self.first_token_at is None:
            self.first_token_at = time.monotonic()
            if self.metrics:
                self.metrics.ttft.observe(self.first_token_at - self.started_at)
        elif isinstance(event, Done) and self.metrics:
            self._count(event.timings)
        self.failed = self.failed or isinstance(event, Failed)
        return event

    def _count(self, timings: Timings) -> None:
        self.metrics.duration.observe(time.monotonic() - self.started_at)
        self.metrics.generated_tokens.inc(timings.completion_tokens)
        self.metrics.prompt_tokens.inc(timings.prompt_tokens)
        self.metrics.image_encode.observe(timings.image_encode_s)
        if timings.reused_session:
            self.metrics.session_reuse.inc()

    def collect(self) -> Done:
        """For non-streaming responses: run to the end and return its Done (or raise the error)."""
        for event in self.events():
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Done):
                return event
        raise APIError("job ended without a result", 500)


def sse_body(stream: JobStream, render: Callable[[Event], str | None], keepalive: str) -> Iterator[str]:
    """SSE text for every event: ``render`` maps an event to SSE text (None = send nothing)."""
    for event in stream.events():
        if event is KEEPALIVE:
            yield keepalive
            continue
        text = render(event)
        if text:
            yield text

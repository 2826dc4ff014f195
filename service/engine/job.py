"""One request's life in the engine: the inference thread writes its events, an HTTP thread reads them.

Each job has its own queue, so a slow reader never holds up the inference thread or other jobs. The state
machine (queued -> running -> finished, or queued -> abandoned) decides races between the inference thread
picking a job up and the reader giving up on it: whoever transitions first wins.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from service.engine.answer_cache import CachedAnswer
from service.engine.conversation import Conversation, Sampling
from service.engine.errors import Overloaded
from service.engine.events import FINAL, KEEPALIVE, Done, Event, Failed, Started, Token

QUEUED, RUNNING, FINISHED, ABANDONED = "queued", "running", "finished", "abandoned"


class Job:
    """One request; HTTP threads read ``events()``, the inference thread calls ``put``."""

    def __init__(self, conversation: Conversation, sampling: Sampling, request_id: str, cache_key: str | None = None):
        self.conversation = conversation
        self.sampling = sampling
        self.request_id = request_id
        self.cache_key = cache_key
        self.enqueued_at = time.monotonic()
        self.started_at: float | None = None  # set by the inference thread when it runs the job
        self.cancelled = threading.Event()
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._state = QUEUED
        self._lock = threading.Lock()

    def _transition(self, old: str, new: str) -> bool:
        with self._lock:
            if self._state != old:
                return False
            self._state = new
            return True

    @property
    def queued(self) -> bool:
        """Still waiting to start (not picked up, not abandoned)."""
        return self._state == QUEUED

    @property
    def finished(self) -> bool:
        return self._state == FINISHED

    def cancel(self) -> None:
        """The client went away: drop the job if still queued, else make the streamer return CANCEL."""
        self.cancelled.set()
        self._transition(QUEUED, ABANDONED)

    def put(self, event: Event) -> None:
        self._events.put(event)

    def events(self, queue_timeout: float, keepalive: float = 1.0) -> Iterator[Event]:
        """Yield events until Done/Failed; a KEEPALIVE every ``keepalive`` s of silence lets callers detect hang-ups."""
        while True:
            try:
                event = self._events.get(timeout=keepalive)
            except queue.Empty:
                expired = self._expire(queue_timeout)
                if expired:
                    yield expired
                    return
                yield KEEPALIVE
                continue
            yield event
            if isinstance(event, FINAL):
                return

    def _expire(self, queue_timeout: float) -> Failed | None:
        """Abandon the job if it waited longer than ``queue_timeout`` without starting; the 503 to send."""
        waited = time.monotonic() - self.enqueued_at
        if waited <= queue_timeout or not self._transition(QUEUED, ABANDONED):
            return None
        return Failed(Overloaded(f"request waited {waited:.0f}s in the queue without starting "
                                 f"(limit VLFLEET_QUEUE_TIMEOUT={queue_timeout:g}s); retry later", 503, retry_after=5))


def replay(conversation: Conversation, sampling: Sampling, request_id: str, answer: CachedAnswer) -> Job:
    """A finished job whose events are a cached answer, in the order a generation would produce them."""
    job = Job(conversation, sampling, request_id)
    job._state = FINISHED
    images = len(conversation.images)
    job.put(Started(reused_session=False, images=images, cache="hit", images_cached=images))  # nothing to encode
    for piece in answer.pieces:
        job.put(Token(piece))
    job.put(Done(finish_reason=answer.finish_reason, text="".join(answer.pieces), timings=answer.timings(),
                 session=None))
    return job

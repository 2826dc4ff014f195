"""Admission and the inference thread's life cycle, shared by both engines.

VLMPipeline is not safe to call from two threads, so HTTP threads never touch it: they submit a Job and
read its events from the job's own queue. A full queue, or queued work estimated to take longer than the queue
timeout, is refused at once (429); a job that waits too long anyway is abandoned (503); a client that goes away
cancels its job, and generation stops so the next job starts promptly. Subclasses own the pipeline: how it is
loaded, warmed up and driven.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time

from service.engine.admission import WaitEstimator
from service.engine.answer_cache import AnswerCache, CachedAnswer, cache_key
from service.engine.conversation import Conversation, Sampling, Timings, Turn
from service.engine.errors import APIError, Overloaded
from service.engine.events import Done, Failed
from service.engine.genai import render_prompt
from service.engine.job import FINISHED, QUEUED, RUNNING, Job, replay
from service.engine.prompt_limits import PromptLimits
from service.engine.routing import HOST
from service.engine.sessions import SessionStore

log = logging.getLogger("vlfleet.engine")

WARMUP_SIDE = 448  # the warm-up picture's side when images are not scaled down (VLFLEET_IMAGE_MAX_SIDE=0)


class Engine:
    """Admission (readiness, memory, answer cache, bounded queue, estimated wait) and the inference thread's life
    cycle.

    Subclasses own the pipeline: ``_warmup`` and ``_serve`` run on the inference thread once it is loaded.
    ``pipeline_factory`` builds the pipeline in that thread (tests inject one that fails on purpose).
    """

    # Queued jobs run one after another (service.engine.admission): engines that run several at once opt out.
    estimates_wait = True
    # The engine constrains an answer to a response_format (json_object, json_schema) while it is generated; the
    # API refuses a response_format on an engine that does not (service.http.api_openai), never ignores it.
    constrains_output = False
    # The most top_logprobs entries per token the engine computes (service.engine.logprobs); None: no token logprobs
    # at all.
    top_logprobs: int | None = None
    # What of a schema its grammar cannot hold, refused by check_format (docs/api.md's engine table says it).
    format_limits = ""

    def __init__(self, settings, metrics=None, pipeline_factory=None, model_id: str = "", memory=None):
        self.settings = settings
        self.metrics = metrics
        self.model_id = model_id or str(settings.model_dir)
        self.memory = memory  # MemoryGuard or None
        self.answers = AnswerCache(int(settings.answer_cache_mb * 2**20), settings.answer_cache_entries)
        self._sessions = SessionStore(capacity=64)  # touched by the inference thread only
        self.limits = PromptLimits(settings, render_prompt)
        self._trim_sessions = threading.Event()
        self._factory = pipeline_factory or (lambda: self._load())
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=settings.queue_size)
        self._thread = threading.Thread(target=self._run, name="inference", daemon=True)
        self.ready = threading.Event()
        self.failed: str | None = None  # why the engine is not ready (while it loads: None)
        self.gave_up = False  # it will not turn ready until the service restarts: /readyz says "failed": true
        self.pipeline = None
        self.running: Job | None = None
        self.load_seconds: float | None = None
        self.admission = WaitEstimator() if self.estimates_wait else None

    def start(self) -> None:
        self._thread.start()

    def trim(self) -> None:
        """Drop what can be rebuilt: cached answers now, cached conversations on the inference thread."""
        self.answers.clear()
        self._trim_sessions.set()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, conversation: Conversation, sampling: Sampling, request_id: str,
               max_wait: float | None = None) -> Job:
        """Queue a job, or refuse it now. ``max_wait``: the load balancer's bound on this request's wait (below
        VLFLEET_QUEUE_TIMEOUT), so that it goes to another host rather than wait here (service.engine.routing)."""
        self._admit_or_refuse()
        self.limits.check(conversation)  # before queueing: a prompt over the limits never takes a queue slot
        if sampling.response_format is not None:
            self.check_format(sampling.response_format)  # a schema it cannot compile never takes a queue slot
        key = cache_key(conversation, sampling, self.model_id)
        answer = self.answers.get(key)
        if answer is not None:
            if self.metrics:
                self.metrics.cache_hits.inc()
            job = replay(conversation, sampling, request_id, answer)
            log_inference(job, answer.timings(), answer.finish_reason, "hit")
            return job
        if key is not None and self.answers.enabled and self.metrics:
            self.metrics.cache_misses.inc()
        self._refuse_long_wait(max_wait)  # after the cache: an answer at hand never waits in the queue
        job = Job(conversation, sampling, request_id, key)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise Overloaded(f"server busy: {self.settings.queue_size} requests already queued; retry later", 429,
                             retry_after=max(1, self._queue.qsize())) from None
        if self.metrics:
            self.metrics.queue_depth.set(self._queue.qsize())
        return job

    def check_format(self, fmt) -> None:
        """Raise the client's 400 for a response format this engine cannot enforce (engines that constrain
        output check their grammar engine here, on the request's thread)."""

    def _admit_or_refuse(self) -> None:
        """Raise a 503 while the model is not ready or memory is short."""
        if not self.ready.is_set():
            raise Overloaded(self.failed or "model is still loading; retry when /readyz returns 200", 503,
                             retry_after=5)
        if self.memory is not None and self.memory.shedding:
            if self.metrics:
                self.metrics.shed.inc()
            raise Overloaded(self.memory.reason() + "; retry later", 503, retry_after=10)

    def _refuse_long_wait(self, max_wait: float | None = None) -> None:
        """429 now for a request that would wait past VLFLEET_QUEUE_TIMEOUT (or the load balancer's ``max_wait``),
        rather than a 503 after that wait.

        Two requests at once may both fit and both queue: the estimate is a bound on waiting, not a slot count.
        """
        wait, limit = self.estimated_wait(), self.settings.queue_timeout
        if wait is None or wait <= min(limit, max_wait if max_wait is not None else limit):
            return
        if wait <= limit:  # within this host's own limit: the load balancer has a better place for it
            raise Overloaded(f"host busy: about {wait:.0f} s of queued work ahead, over the load balancer's "
                             f"{max_wait:g} s for this conversation's host; another host takes it", 429,
                             retry_after=max(1, math.ceil(wait)), reason="affinity_wait")
        raise Overloaded(f"server busy: about {wait:.0f} s of queued work ahead, over VLFLEET_QUEUE_TIMEOUT="
                         f"{limit:g}s; retry later", 429, retry_after=max(1, math.ceil(wait)), reason="wait")

    def estimated_wait(self) -> float | None:
        """Seconds a request submitted now would wait to start; None without an estimate (none learnt yet)."""
        if self.admission is None:
            return None
        running = self.running  # its started_at was set before it became the running job
        # A job that has sent its answer is no work ahead, though the inference thread has not let go of it yet: a
        # client that asks again at once (a follow-up) must not wait, or be sent away, for the previous answer.
        busy = running is not None and not running.finished
        current = (running.sampling.max_tokens, time.monotonic() - running.started_at) if busy else None
        with self._queue.mutex:  # queue.Queue's own lock: a consistent look at what waits, without taking it out
            queued = [job.sampling.max_tokens for job in self._queue.queue if job.queued]
        return self.admission.wait(current, queued)

    # --- inference thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            started = time.monotonic()
            self.pipeline = self._factory()
            if self.settings.warmup:
                self._warmup()
                self._sessions.clear()  # the warm-up is nobody's conversation
                self._release_mapped_weights()
            self.load_seconds = time.monotonic() - started
            log.info("model ready", extra={"load_seconds": round(self.load_seconds, 2)})
            self.ready.set()
        except Exception as e:  # a model that cannot load leaves the process alive but never ready
            self._give_up(f"model failed to load: {e}")
            log.exception("model failed to load")
            return
        self._serve()

    def _give_up(self, reason: str) -> None:
        """Never ready again in this process: /readyz 503 with ``reason`` and ``failed``, so that whoever waits for
        readiness (the start gate, tune, the bench) stops at once instead of waiting out its timeout."""
        self.ready.clear()
        self.failed = reason
        self.gave_up = True

    def _release_mapped_weights(self) -> None:
        from service.runtime.mapped_weights import release

        try:
            released = release(self.settings.model_dir)
        except OSError as e:  # an optimisation: never a reason not to serve
            log.warning("could not release mapped weights", extra={"error": str(e)})
            return
        log.info("released mapped weight pages after warm-up", extra={"mapped_mib": released // 2**20})

    def _load(self):
        raise NotImplementedError

    @functools.cached_property
    def tokenizer(self):
        return self.pipeline.get_tokenizer()

    def _serve(self) -> None:
        """One job at a time (engines whose pipeline answers one request at a time)."""
        while True:
            self._run_job(self._next_job())

    def _run_job(self, job: Job) -> None:
        job.started_at = time.monotonic()
        self.running = job
        try:
            self._generate(job)
        except Exception as e:
            log.exception("generation failed", extra={"request_id": job.request_id})
            self._fail(job, self._failure(e))
        finally:
            self.running = None
            job._transition(RUNNING, FINISHED)

    def _generate(self, job: Job) -> None:
        raise NotImplementedError

    def _failure(self, error: Exception) -> Exception:
        """The error a job whose generation raised ``error`` fails with; engines may also reset state here."""
        return error

    def _warmup(self) -> None:
        raise NotImplementedError

    def _warmup_job(self) -> Job:
        """Two tokens about a picture as large as an auto-detail image is scaled to (VLFLEET_IMAGE_MAX_SIDE): an
        OpenVINO model grows its buffers at the first input larger than any before it, which the first request would
        pay otherwise (docs/engines.md)."""
        side = self.settings.image_max_side or WARMUP_SIDE
        return Job(warmup_conversation(side), Sampling(max_tokens=2), "warmup")

    def _next_job(self, timeout: float | None = None) -> Job | None:
        """The next queued job that was not abandoned, or None after ``timeout`` seconds."""
        while True:
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                return None
            if self.metrics:
                self.metrics.queue_depth.set(self._queue.qsize())
            if self._trim_sessions.is_set():
                self._trim_sessions.clear()
                self._sessions.clear()
            if job._transition(QUEUED, RUNNING):
                return job

    def _finish(self, job: Job, pieces: list[str], timings: Timings, session_key: str | None = None) -> None:
        """Classify the ending, remember the answer, and send Done."""
        finish = self._finish_reason(job, timings)
        if finish != "cancelled" and job.cache_key is not None:
            self.answers.put(job.cache_key, CachedAnswer(tuple(pieces), finish, timings.prompt_tokens,
                                                         timings.completion_tokens))
            if self.metrics:
                self.metrics.cache_bytes.set(self.answers.bytes)
        job.put(Done(finish_reason=finish, text="".join(pieces), timings=timings,
                     session=session_key if finish != "cancelled" else None))
        job._transition(RUNNING, FINISHED)
        if self.admission is not None and job is self.running:  # not the warm-up: a cold first run, not typical
            self.admission.learn(timings)
        log_inference(job, timings, finish, "miss")

    def _finish_reason(self, job: Job, timings: Timings) -> str:
        if job.cancelled.is_set():
            if self.metrics:
                self.metrics.cancelled.inc()
            return "cancelled"
        return "length" if timings.completion_tokens >= job.sampling.max_tokens else "stop"

    def _resolve(self, job: Job) -> tuple[Conversation, bool]:
        """The job's whole conversation (earlier turns of its session included), within the prompt limits."""
        conv, reused = self._sessions.resolve(job.conversation)
        if reused:
            self.limits.check(conv)  # the request alone was checked at the door; its session adds turns
        if self.metrics:
            self.metrics.prompt_images.inc(len(conv.images))
        return conv, reused

    @staticmethod
    def _fail(job: Job, error: Exception) -> None:
        """Send the job the client's error (APIError), or a 500 for a generation that raised ``error``."""
        if not isinstance(error, APIError):
            error = APIError(f"generation failed: {error}", 500, code="generation_failed")
        job.put(Failed(error))


def log_inference(job: Job, timings: Timings, finish: str, cache: str) -> None:
    """One JSON line per answer, the time and resources it took (the HTTP request line of a stream only knows
    when its headers went out)."""
    ms = timings.ms_per_token
    log.info("inference", extra={
        "request_id": job.request_id, "host": HOST, "cache": cache, "finish_reason": finish,
        "images": len(job.conversation.images), "queue_wait_s": round(timings.queued_s, 4),
        "image_encode_s": round(timings.image_encode_s, 4),
        "first_token_s": None if timings.first_token_s is None else round(timings.first_token_s, 4),
        "total_s": round(timings.total_s, 4), "prompt_tokens": timings.prompt_tokens,
        "completion_tokens": timings.completion_tokens, "ms_per_token": None if ms is None else round(ms, 2),
        "prefix_reuse": timings.reused_session, "rss_mib": _rss_mib(), **timings.extra})


@functools.cache
def _process():
    import psutil

    return psutil.Process()


def _rss_mib() -> int:
    return _process().memory_info().rss // 2**20


def warmup_conversation(side: int = 64) -> Conversation:
    """A one-image question the engines answer (two tokens) before declaring themselves ready, about a ``side`` x
    ``side`` picture."""
    import numpy as np

    from service.engine.images import PreparedImage

    pixels = np.full((1, side, side, 3), 127, dtype=np.uint8)
    return Conversation((Turn("user", "Describe the image.", (PreparedImage(pixels, "warmup", (side, side)),)),))

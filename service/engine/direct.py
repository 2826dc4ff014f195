"""The direct engine: one request at a time, like the serial engine, but over the artifact's sub-models
(service.engine.direct_pipeline) so that a follow-up neither runs the vision encoder again nor recomputes the
turns before it. The same queue, answer cache, sessions, limits, metrics and SSE as the other engines.
It samples itself, so it enforces a response format itself: a JSON schema compiled into a token mask per step
(service.engine.structured).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from service.engine.base import Engine
from service.engine.conversation import Conversation, Timings
from service.engine.direct_pipeline import DirectPipeline, Generation
from service.engine.events import Started, Token
from service.engine.job import Job


@dataclass
class Running:
    """One answer being generated: its job, whole conversation and timings, and what has gone out of it so far."""

    job: Job
    conversation: Conversation  # the whole conversation, earlier turns of its session included
    started: float
    timings: Timings
    pieces: list[str] = field(default_factory=list)
    pending: list[dict] = field(default_factory=list)  # logprob entries of tokens whose text has not gone out yet

    def text(self, piece: str) -> None:
        if self.timings.first_token_s is None:
            self.timings.first_token_s = time.monotonic() - self.started
        self.pieces.append(piece)
        self.job.put(Token(piece, tuple(self.pending)))
        self.pending.clear()


class DirectEngine(Engine):
    """One DirectPipeline; its kept images and conversations' KV survive between requests (images trimmed under
    memory pressure)."""

    constrains_output = True  # response_format: the answer is generated under the schema's grammar
    top_logprobs = 20  # it has the logits of every step (service.engine.logprobs.from_logits)

    def check_format(self, fmt) -> None:
        """A schema the grammar engine cannot enforce is a 400 at submit, not after a wait in the queue; compiled
        here (on the request's thread), the inference thread takes it from the cache."""
        if self.pipeline is not None:
            self.pipeline.grammars.compiled(fmt)

    def _load(self):
        return DirectPipeline(self.settings)

    def trim(self) -> None:
        super().trim()
        if self.pipeline is not None:
            # Thread-safe. The KV state stays: it belongs to the inference thread and the prompt limits bound it.
            self.pipeline.vision.trim()

    def _failure(self, error: Exception) -> Exception:
        self.pipeline.lm.reset()  # a half-fed state is nobody's conversation
        return error

    def _warmup(self) -> None:
        self._generate(self._warmup_job())
        self.pipeline.trim()  # the warm-up image and prompt are nobody's

    def _generate(self, job: Job) -> None:
        r = self._begin(job, time.monotonic())
        stats = self.pipeline.generate(r.conversation, job.sampling, r.text, job.cancelled.is_set, r.pending.append)
        self._end(r, stats)

    def _begin(self, job: Job, started: float, record: type[Running] = Running) -> Running:
        """The job's whole conversation and its ``record``; Started sent (before its images are encoded)."""
        conv, reused = self._resolve(job)
        cached = sum(self.pipeline.vision.holds(img.digest) for img in conv.images)
        job.put(Started(reused_session=reused, images=len(conv.images), cache="miss", images_cached=cached))
        return record(job, conv, started, Timings(queued_s=started - job.enqueued_at, reused_session=reused))

    def _end(self, r: Running, stats: Generation, **extra) -> None:
        """Send what is left, count what the answer reused, remember the conversation, and finish the job."""
        if r.pending:  # tokens that made no text (special tokens, a held-back stop string): their logprobs all the same
            r.job.put(Token("", tuple(r.pending)))
        timings = r.timings
        timings.total_s = time.monotonic() - r.started
        timings.prompt_tokens, timings.completion_tokens = stats.prompt_tokens, stats.completion_tokens
        timings.image_encode_s = stats.image_encode_s
        timings.extra.update(reused_tokens=stats.reused_tokens, images_encoded=stats.images_encoded, **extra)
        if self.metrics:
            self.metrics.vision_encoder_runs.inc(stats.images_encoded)
            self.metrics.reused_prompt_tokens.inc(stats.reused_tokens)
        key = None if r.job.cancelled.is_set() else self._sessions.remember(r.conversation, "".join(r.pieces))
        self._finish(r.job, r.pieces, timings, key)


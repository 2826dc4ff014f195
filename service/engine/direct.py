"""The direct engine: one request at a time, like the serial engine, but over the artifact's sub-models
(service.engine.direct_pipeline) so that a follow-up neither runs the vision encoder again nor recomputes the
turns before it. The same queue, answer cache, sessions, limits, metrics and SSE as the other engines.
It samples itself, so it enforces a response format itself: a JSON schema compiled into a token mask per step
(service.engine.structured).
"""

from __future__ import annotations

import time

from service.conversation import Sampling, Timings
from service.engine.base import Engine, warmup_conversation
from service.engine.direct_pipeline import DirectPipeline
from service.engine.events import Started, Token
from service.engine.job import Job


class DirectEngine(Engine):
    """One DirectPipeline; its kept images and KV state survive between requests (trimmed under memory pressure)."""

    constrains_output = True  # response_format: the answer is generated under the schema's grammar
    top_logprobs = 20  # it has the logits of every step (service.logprobs.from_logits)

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
        self._generate(Job(warmup_conversation(), Sampling(max_tokens=2), "warmup"))
        self.pipeline.trim()  # the warm-up image and prompt are nobody's

    def _generate(self, job: Job) -> None:
        started = time.monotonic()
        conv, reused = self._resolve(job)
        timings = Timings(queued_s=started - job.enqueued_at, reused_session=reused)
        cached = sum(self.pipeline.vision.holds(img.digest) for img in conv.images)
        job.put(Started(reused_session=reused, images=len(conv.images), cache="miss", images_cached=cached))
        pieces: list[str] = []
        pending: list[dict] = []  # logprob entries of the tokens whose text has not gone out yet

        def on_text(text: str) -> None:
            if timings.first_token_s is None:
                timings.first_token_s = time.monotonic() - started
            pieces.append(text)
            job.put(Token(text, tuple(pending)))
            pending.clear()

        stats = self.pipeline.generate(conv, job.sampling, on_text, job.cancelled.is_set, pending.append)
        if pending:  # tokens that made no text (special tokens, a held-back stop string): their logprobs all the same
            job.put(Token("", tuple(pending)))
        timings.total_s = time.monotonic() - started
        timings.prompt_tokens, timings.completion_tokens = stats.prompt_tokens, stats.completion_tokens
        timings.image_encode_s = stats.image_encode_s
        timings.extra.update(reused_tokens=stats.reused_tokens, images_encoded=stats.images_encoded)
        if self.metrics:
            self.metrics.vision_encoder_runs.inc(stats.images_encoded)
            self.metrics.reused_prompt_tokens.inc(stats.reused_tokens)
        key = None if job.cancelled.is_set() else self._sessions.remember(conv, "".join(pieces))
        self._finish(job, pieces, timings, key)

"""The continuous-batching engine: one ContinuousBatchingPipeline stepped by one thread.

Concurrent requests share decode steps instead of queueing behind each other. Each step admits waiting
jobs up to VLFLEET_MAX_BATCH, runs one scheduler step, and hands every job its new tokens. Follow-ups
re-send the whole conversation (or name their session); the scheduler's prefix cache re-uses the KV blocks of the
part it has seen.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from service.engine.base import Engine
from service.engine.conversation import Conversation, Timings
from service.engine.detokenize import IncrementalDecoder
from service.engine.events import Started, Token
from service.engine.genai import (
    BOUNDS_LIMIT,
    check_bounds,
    check_schema,
    generation_config,
    image_tensors,
    load_batching_pipeline,
    render_prompt,
)
from service.engine.job import RUNNING, Job
from service.engine.logprobs import TokenBytes, entry

log = logging.getLogger("vlfleet.engine")


@dataclass
class Active:
    """A job admitted to the pipeline, and what has been streamed of it so far."""

    job: Job
    conversation: Conversation  # the whole conversation, earlier turns of its session included
    handle: Any  # openvino_genai.GenerationHandle
    started: float
    timings: Timings
    decoder: IncrementalDecoder
    tokens: int = 0
    pieces: list[str] = field(default_factory=list)
    pending: list[dict] = field(default_factory=list)  # logprob entries of tokens whose text has not gone out yet


class BatchingEngine(Engine):
    """A ContinuousBatchingPipeline stepped by the inference thread, up to VLFLEET_MAX_BATCH jobs per step."""

    # No admission by estimated wait: a queued job starts when any of up to VLFLEET_MAX_BATCH active jobs ends, and
    # shared steps slow each one down, so the sum of serial job times (service.engine.admission) would overstate the
    # wait many times over. The bounded queue (429) and the queue timeout (503) still hold here.
    estimates_wait = False
    constrains_output = True  # genai's StructuredOutputConfig (xgrammar) on each request's GenerationConfig
    top_logprobs = 0  # genai's generated_log_probs: the chosen token's logprob, no top-k (service.engine.logprobs)
    format_limits = BOUNDS_LIMIT

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        return TokenBytes(self.settings.model_dir / "tokenizer.json")

    def check_format(self, fmt) -> None:
        check_schema(fmt)  # before add_request: a schema xgrammar cannot compile would break the pipeline's steps
        check_bounds(fmt)

    def _load(self):
        return load_batching_pipeline(self.settings)

    def _warmup(self) -> None:
        job = self._warmup_job()
        job._state = RUNNING
        active = [self._admit(job)]
        for _ in range(10_000):
            if not active:
                return
            self.pipeline.step()
            active = self._drain(active)
        raise RuntimeError("warm-up generation did not finish")

    def _serve(self) -> None:
        active: list[Active] = []
        while True:
            self._admit_waiting(active)
            if active:
                active = self._step(active)

    def _admit_waiting(self, active: list[Active]) -> None:
        """Admit queued jobs up to VLFLEET_MAX_BATCH; block for one only when nothing is running."""
        while len(active) < self.settings.max_batch:
            job = self._next_job(timeout=None if not active else 0)
            if job is None:
                return
            try:
                active.append(self._admit(job))
            except Exception as e:
                log.exception("request rejected by the pipeline", extra={"request_id": job.request_id})
                self._fail(job, e)

    def _step(self, active: list[Active]) -> list[Active]:
        """One scheduler step for every active job; the jobs still running after it."""
        try:
            self.pipeline.step()
        except Exception as e:  # one bad step must not strand every stream: fail them, keep serving
            log.exception("pipeline step failed")
            for a in active:
                self._fail(a.job, e)
            return []
        return self._drain(active)

    _ids = itertools.count(1)

    def _admit(self, job: Job) -> Active:
        cfg = generation_config(job.sampling)
        cfg.apply_chat_template = False  # rendered below, images tagged in their turns
        started = time.monotonic()
        conv, reused = self._resolve(job)
        images = image_tensors(conv)
        handle = self.pipeline.add_request(next(self._ids), render_prompt(self.tokenizer, conv), images, cfg)
        job.put(Started(reused_session=reused, images=len(images), cache="miss"))
        if self.metrics:
            self.metrics.vision_encoder_runs.inc(len(images))  # genai encodes every image of every prompt
        timings = Timings(queued_s=started - job.enqueued_at, reused_session=reused)
        return Active(job, conv, handle, started, timings, IncrementalDecoder(self.tokenizer))

    def _drain(self, active: list[Active]) -> list[Active]:
        """Stream new tokens of every active job; return those still running."""
        import openvino_genai as ov_genai

        still = []
        for a in active:
            if a.job.cancelled.is_set():
                a.handle.cancel()
            if a.handle.can_read():
                for output in a.handle.read().values():
                    a.tokens += len(output.generated_ids)
                    if a.job.sampling.logprobs:
                        ids, lps = output.generated_ids, output.generated_log_probs
                        a.pending.extend(entry(self.token_bytes(t), lp) for t, lp in zip(ids, lps, strict=False))
                    self._stream(a, a.decoder.push(output.generated_ids))
            status = a.handle.get_status()
            if status == ov_genai.GenerationStatus.RUNNING or a.handle.can_read():
                still.append(a)
                continue
            self._complete(a)
        return still

    def _stream(self, a: Active, text: str) -> None:
        if not text:
            return  # nothing yet, or an incomplete UTF-8 sequence: wait for the rest of the character
        if a.timings.first_token_s is None:
            a.timings.first_token_s = time.monotonic() - a.started
        a.pieces.append(text)
        a.job.put(Token(text, tuple(a.pending)))
        a.pending.clear()

    def _complete(self, a: Active) -> None:
        timings = a.timings
        timings.total_s = time.monotonic() - a.started
        self._stream(a, a.decoder.flush())
        if a.pending:  # tokens that made no text (special tokens): their logprobs all the same
            a.job.put(Token("", tuple(a.pending)))
        timings.completion_tokens = a.tokens
        try:
            perf = a.handle.get_vlm_perf_metrics()
            timings.prompt_tokens = int(perf.get_num_input_tokens())
            timings.image_encode_s = float(perf.get_prepare_embeddings_duration().mean) / 1000.0
        except Exception:  # metrics are best effort; the answer is what matters
            timings.prompt_tokens = 0
        key = None if a.job.cancelled.is_set() else self._sessions.remember(a.conversation, "".join(a.pieces))
        self._finish(a.job, a.pieces, timings, key)

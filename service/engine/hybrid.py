"""The hybrid engine: the direct engine with llama.cpp's language model (service.engine.llama_lm) behind its
OpenVINO vision tower (service.engine.vision), for hosts where llama.cpp decodes faster and OpenVINO encodes images
faster (AMD EPYC, docs/engines.md). Its loop is also the paged engine's (service.engine.paged), over OpenVINO's own
language model.

Everything but the language model is the direct engine's: prompt, kept images, sampling, grammar, logprobs
(service.engine.direct_pipeline.Answer). Unlike direct it answers up to VLFLEET_MAX_BATCH requests at once (at most
the language model's ``sequences``: 4 for llama.cpp), each in its own sequence of one KV cache
(service.engine.kept_sequences):

- each turn of the loop feeds one chunk (PREFILL_CHUNK tokens) of one new prompt, then runs one decode step for
  every answer past its prompt, the step in one batch: a long new prompt delays the others' next tokens by a chunk
  at a time, never by its whole prefill;
- each conversation's KV stays in its sequence after its answer, so its follow-up computes its new turn only, while
  other conversations come and go (up to ``sequences`` kept; the cache's room decides);
- a new request whose prompt and longest answer do not fit beside the running ones waits for one to finish.

A new request's images are encoded when it is admitted, between two decode steps (the others wait for it), and it is
admitted once every running answer has its first token.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from service.engine.direct import DirectEngine, Running
from service.engine.direct_pipeline import Answer, DirectPipeline
from service.engine.job import FINISHED, RUNNING, Job
from service.engine.kept_sequences import KeptSequences, Sequence
from service.engine.llama_lm import LlamaLM

log = logging.getLogger("vlfleet.engine")

PREFILL_CHUNK = 128  # prompt tokens per turn of the loop while other answers are decoding


@dataclass
class Batched(Running):
    """An answer of the batch: also its sequence once claimed, where its prompt's prefill is, and its logits."""

    answer: Answer | None = None
    seq: Sequence | None = None
    prefill: object = None  # while its prompt is being computed: LlamaLM.feed's iterator (paged: tokens computed)
    logits: object = None  # the logits the next token is drawn from
    batch_max: int = 0  # the most answers a decode step of this one shared (the inference log's decode_batch_max)
    prefill_on: str = ""  # the runtime that computed its prompt (the inference log's prefill_on)
    prompt_s: float | None = None  # from its start until its prompt was computed (the inference log's prompt_s)

    @property
    def has_first_token(self) -> bool:
        return self.batch_max > 0  # its first token was drawn and went into a decode step


class HybridEngine(DirectEngine):
    # Several answers share decode steps, so the sum of queued job times would overstate a wait (as on batching).
    estimates_wait = False
    language_model: type[KeptSequences] = LlamaLM  # what keeps the sequences and steps them (paged: OpenVINO's)

    def _load(self):
        return DirectPipeline(self.settings, language_model=self.language_model)

    def _failure(self, error: Exception) -> Exception:
        try:
            self.pipeline.lm.reset()  # llama.cpp: a child that died is replaced here, before the next request
        except Exception as e:  # whatever stops a new child from loading ends serving
            log.exception("the language model could not be started again")
            self._give_up(f"the language model could not be started again: {e}")
        return error

    # --- the loop -------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        running: list[Batched] = []
        waiting: deque[Batched] = deque()  # admitted, but no room in the KV cache yet
        limit = min(self.settings.max_batch, self.pipeline.lm.sequences)
        while True:
            self._admit(running, waiting, limit)
            if running:
                try:
                    self._turn(running)
                except Exception as e:  # the language model failed (llama.cpp: or its child died): all are lost
                    log.exception("batched step failed")
                    error = self._failure(e)  # every sequence is forgotten (a new child if it died)
                    for r in running:
                        self._fail(r.job, error)
                        r.job._transition(RUNNING, FINISHED)
                    running.clear()

    def _admit(self, running: list[Batched], waiting: deque[Batched], limit: int) -> None:
        """Start queued requests while fewer than ``limit`` run and every one has its first token; block for one only
        when nothing runs. A new request's images are encoded once the one before reached its first token: the work
        is the same as admitting all at once, but the first answers start sooner."""
        while len(running) < limit and all(r.has_first_token for r in running):
            if waiting:
                r = waiting.popleft()
            else:
                job = self._next_job(timeout=None if not running else 0)
                if job is None:
                    return
                r = self._start(job)
                if r is None:
                    continue
            claimed = self.pipeline.lm.claim(r.answer.prompt, r.job.sampling.max_tokens)
            if claimed is None and not running:  # alone, it can never fit: a setting, not a wait
                self._drop(r, self.pipeline.lm.too_long(len(r.answer.prompt.ids), r.job.sampling.max_tokens))
                continue
            if claimed is None:
                waiting.appendleft(r)
                return
            r.seq, keep = claimed
            r.answer.stats.reused_tokens = keep
            r.prefill_on = self.pipeline.lm.prefill_on(len(r.answer.prompt.ids), keep)
            self._begin_prefill(r, keep)
            running.append(r)

    def _begin_prefill(self, r: Batched, keep: int) -> None:
        r.prefill = self.pipeline.lm.feed(r.seq, r.answer.prompt, keep, PREFILL_CHUNK)

    def _start(self, job: Job) -> Batched | None:
        """The request's answer, its images encoded; None if that failed (the job is told why)."""
        job.started_at = started = time.monotonic()
        try:
            r = self._begin(job, started, Batched)
            r.answer = Answer(self.pipeline, r.conversation, job.sampling, r.text, job.cancelled.is_set,
                              r.pending.append)
        except Exception as e:
            log.exception("request failed before generation", extra={"request_id": job.request_id})
            self._fail(job, e)
            job._transition(RUNNING, FINISHED)
            return None
        return r

    def _turn(self, running: list[Batched]) -> None:
        """One chunk of the first prompt still being computed, then one decode step for every answer past its
        prompt; answers that end are finished and leave ``running``."""
        filling = next((r for r in running if r.prefill is not None), None)
        if filling is not None:
            out = next(filling.prefill)
            if out is not None:
                self._prompt_done(filling, out)
        steps, stepping = self._next_tokens(running)
        if steps:
            self._stepped(stepping, self.pipeline.lm.step_many(steps))

    @staticmethod
    def _prompt_done(r: Batched, logits) -> None:
        r.logits, r.prefill, r.prompt_s = logits, None, time.monotonic() - r.started

    def _next_tokens(self, running: list[Batched]) -> tuple[list[tuple[Sequence, int, int]], list[Batched]]:
        """The next token of every answer past its prompt, as a decode step's (sequence, token, position) rows, and
        those answers; answers that end are finished and leave ``running``."""
        steps, stepping = [], []
        for r in [r for r in running if r.prefill is None]:
            try:
                token = r.answer.next_token(r.logits)
            except Exception as e:  # this answer's own failure (its grammar): the others go on
                log.exception("generation failed", extra={"request_id": r.job.request_id})
                running.remove(r)
                self._drop(r, e)
                continue
            if token is None:
                running.remove(r)
                self._complete(r)
                continue
            steps.append((r.seq, token, r.answer.position))
            stepping.append(r)
        return steps, stepping

    @staticmethod
    def _stepped(stepping: list[Batched], logits) -> None:
        for r, row in zip(stepping, logits, strict=True):
            r.logits = row
            r.batch_max = max(r.batch_max, len(stepping))

    def _complete(self, r: Batched) -> None:
        stats = r.answer.finish()
        self.pipeline.lm.release(r.seq)
        self._end(r, stats, decode_batch_max=r.batch_max, prefill_on=r.prefill_on, prompt_s=round(r.prompt_s, 4))

    def _drop(self, r: Batched, error: Exception) -> None:
        """End ``r`` with ``error``; its sequence keeps nothing (a half-fed state is nobody's conversation)."""
        if r.seq is not None:
            self.pipeline.lm.forget(r.seq)
        self._fail(r.job, error)
        r.job._transition(RUNNING, FINISHED)

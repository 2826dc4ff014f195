"""The serial engine: one VLMPipeline answering one request at a time.

VLMPipeline.generate blocks until the answer is complete and streams through a callback, so the inference
thread takes the next job only when the previous one is done. The callback's CANCEL return is how a client
that went away stops its generation early.
"""

from __future__ import annotations

import time

from service.engine.base import Engine
from service.engine.conversation import Timings
from service.engine.detokenize import token_streamer
from service.engine.events import Started, Token
from service.engine.genai import (
    BOUNDS_LIMIT,
    check_bounds,
    check_schema,
    generation_config,
    grammar_error,
    image_tensors,
    load_pipeline,
    render_prompt,
)
from service.engine.job import Job


class SerialEngine(Engine):
    """One VLMPipeline, one request at a time; follow-ups re-use the prefix cache's KV blocks of earlier turns."""

    constrains_output = True  # genai's StructuredOutputConfig (xgrammar) on the job's GenerationConfig
    # top_logprobs stays None: VLMPipeline's results and streamer carry no per-token logprobs (a whole answer's
    # score only), so the serial engine refuses logprobs (service.engine.logprobs.refusal).

    format_limits = BOUNDS_LIMIT

    def check_format(self, fmt) -> None:
        check_schema(fmt)
        check_bounds(fmt)

    def _load(self):
        return load_pipeline(self.settings)

    def _warmup(self) -> None:
        self._generate(self._warmup_job())

    def _generate(self, job: Job) -> None:
        started = time.monotonic()
        conv, reused = self._resolve(job)
        timings = Timings(queued_s=started - job.enqueued_at, reused_session=reused)
        images = image_tensors(conv)
        job.put(Started(reused_session=reused, images=len(images), cache="miss"))
        if self.metrics:
            self.metrics.vision_encoder_runs.inc(len(images))  # genai encodes every image of every prompt
        pieces: list[str] = []
        cfg = generation_config(job.sampling)
        cfg.apply_chat_template = False  # rendered here, images tagged in their turns
        result = self.pipeline.generate(render_prompt(self.tokenizer, conv), images=images, generation_config=cfg,
                                        streamer=self._streamer(job, pieces, timings, started))
        timings.total_s = time.monotonic() - started
        perf = result.perf_metrics
        timings.prompt_tokens = int(perf.get_num_input_tokens())
        timings.completion_tokens = int(perf.get_num_generated_tokens())
        timings.image_encode_s = float(perf.get_prepare_embeddings_duration().mean) / 1000.0
        key = None if job.cancelled.is_set() else self._sessions.remember(conv, "".join(pieces))
        self._finish(job, pieces, timings, key)

    def _failure(self, error: Exception) -> Exception:
        return grammar_error(error) or error

    def _streamer(self, job: Job, pieces: list[str], timings: Timings, started: float):
        """genai's streamer callback: collect and send each piece of text; CANCEL once the client has gone."""
        import openvino_genai as ov_genai

        def streamer(text: str):
            if timings.first_token_s is None:
                timings.first_token_s = time.monotonic() - started
            pieces.append(text)
            job.put(Token(text))
            return ov_genai.StreamingStatus.CANCEL if job.cancelled.is_set() else ov_genai.StreamingStatus.RUNNING

        # Stop strings are matched by genai on text, so their answers keep genai's own (delayed) text streamer.
        return streamer if job.sampling.stop else token_streamer(self.tokenizer, streamer)

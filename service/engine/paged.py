"""The paged engine: the direct engine's OpenVINO sub-models, with its language model over a paged KV cache
(service.engine.paged_lm) so that several conversations share each decode step while each keeps its KV and its
images: batching and follow-up reuse at once, on the hosts where OpenVINO's language model is the faster one.

The loop is the hybrid engine's (service.engine.hybrid): up to VLFLEET_MAX_BATCH answers (at most
PagedLM.sequences, 8), a new prompt computed a chunk at a time between decode steps, a follow-up continued from
its conversation's sequence. The cache holds VLFLEET_KV_CACHE_GB.

Unlike hybrid, a turn of the loop is one call: the decode step's rows go in the same call as the prompt chunk, which
takes PREFILL_CHUNK rows less the step's. The matmuls of a chunk cost about the same with a few rows more, and a
call of its own reads every weight again (ops.bench.paged_steps' fused rows). The whole call keeps to PREFILL_CHUNK
rows: the CPU plugin's matmul time is not smooth in the row count, and a few rows past a chunk can cost more than
the rows themselves.
"""

from __future__ import annotations

from service.engine.hybrid import PREFILL_CHUNK, Batched, HybridEngine
from service.engine.paged_lm import PagedLM


class PagedEngine(HybridEngine):
    language_model = PagedLM

    def _begin_prefill(self, r: Batched, keep: int) -> None:
        r.prefill = keep  # the prompt's tokens its sequence holds; _turn computes the rest

    def _turn(self, running: list[Batched]) -> None:
        """The decode step of every answer past its prompt and the next chunk of the first prompt still being
        computed, in one call; answers that end are finished and leave ``running``."""
        steps, stepping = self._next_tokens(running)
        filling = next((r for r in running if r.prefill is not None), None)
        if filling is None:
            if steps:
                self._stepped(stepping, self.pipeline.lm.step_many(steps))
            return
        prompt, start = filling.answer.prompt, filling.prefill
        end = min(len(prompt.ids), start + PREFILL_CHUNK - len(steps))
        last, logits = self.pipeline.lm.feed_beside(filling.seq, prompt, start, end, steps)
        if end < len(prompt.ids):
            filling.prefill = end
        else:
            self._prompt_done(filling, last)
        if steps:
            self._stepped(stepping, logits)

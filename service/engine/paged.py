"""The paged engine: the direct engine's OpenVINO sub-models, with its language model over a paged KV cache
(service.engine.paged_lm) so that several conversations share each decode step while each keeps its KV and its
images: batching and follow-up reuse at once, on the hosts where OpenVINO's language model is the faster one.

The loop is the hybrid engine's (service.engine.hybrid): up to VLFLEET_MAX_BATCH answers (at most
kept_sequences.SEQUENCES), a new prompt computed a chunk at a time between decode steps, a follow-up continued from
its conversation's sequence. The cache holds VLFLEET_KV_CACHE_GB.
"""

from __future__ import annotations

from service.engine.hybrid import HybridEngine
from service.engine.paged_lm import PagedLM


class PagedEngine(HybridEngine):
    language_model = PagedLM

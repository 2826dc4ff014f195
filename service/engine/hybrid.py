"""The hybrid engine: the direct engine with llama.cpp's language model (service.engine.llama_lm) behind its
OpenVINO vision tower (service.engine.vision), for hosts where llama.cpp decodes faster and OpenVINO encodes images
faster (AMD EPYC, docs/engines.md).

Everything but the language model is the direct engine's: prompt, kept images, sampling, grammar, logprobs. The
language model keeps the KV of several conversations (llama.cpp sequences), so two clients taking turns both get
their follow-ups from the cache.
"""

from __future__ import annotations

import logging

from service.engine.direct import DirectEngine
from service.engine.direct_pipeline import DirectPipeline
from service.engine.llama_lm import LlamaLM

log = logging.getLogger("vlfleet.engine")


class HybridEngine(DirectEngine):
    def _load(self):
        return DirectPipeline(self.settings, language_model=LlamaLM)

    def _failure(self, error: Exception) -> Exception:
        try:
            self.pipeline.lm.reset()  # a child that died is replaced here, before the next request
        except Exception as e:  # whatever stops a new child from loading ends serving
            log.exception("the llama.cpp child could not be started again")
            self._give_up(f"llama.cpp's language model could not be started again: {e}")
        return error

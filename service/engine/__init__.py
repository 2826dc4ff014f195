"""The inference engine: one pipeline, driven by one thread, fed by a bounded queue of jobs.

HTTP threads submit a Job and read its typed events; only the inference thread touches the pipeline.

- ``events``: what a job streams (Started, Token, Done, Failed, KEEPALIVE).
- ``job``: a Job's queue, states and cancellation; ``replay`` of a cached answer.
- ``base``: Engine, admission (readiness, memory, answer cache, queue) and the inference thread's life cycle.
- ``serial``: SerialEngine, one VLMPipeline answering one request at a time.
- ``batching``: BatchingEngine, a ContinuousBatchingPipeline whose requests share decode steps.
- ``genai``: the OpenVINO GenAI specifics both engines share: prompt, generation config, pipeline loading.
- ``direct``: DirectEngine (the default), one request at a time over the artifact's sub-models (``vision``: the
  vision encoder with kept results; ``prompt``: a conversation's tokens, positions and rows as the language model
  takes them; ``paged_lm``: the language model, its last few conversations' KV kept; ``direct_pipeline``: prompt,
  sampling and text out).
- ``llamacpp``: LlamaCppEngine, a private llama-server child process on a GGUF artifact (``llamacpp_child``
  starts, watches and stops it; ``llamacpp_api`` is what is said to it).
- ``hybrid``: HybridEngine, the direct engine with llama.cpp's language model (``llama_lm``, in the child process
  ``llama_worker`` runs, through ops/llamacpp/vlfleet_llama.c), several conversations' KV kept side by side
  (``kept_sequences``) and stepped together.
- ``paged``: PagedEngine, hybrid's loop over the artifact's own language model on a paged KV cache (``paged_lm``).

Dependencies point one way (events <- job <- base <- serial, batching, direct, llamacpp; direct <- hybrid <- paged;
genai beside them) and the modules import each other directly, never this package, so importing any of them cannot
make a cycle.
"""

from __future__ import annotations

from service.engine.base import Engine
from service.engine.batching import BatchingEngine
from service.engine.direct import DirectEngine
from service.engine.events import KEEPALIVE, Done, Event, Failed, Keepalive, Started, Token
from service.engine.genai import generation_config, load_pipeline, pipeline_properties, render_prompt
from service.engine.hybrid import HybridEngine
from service.engine.job import Job
from service.engine.llamacpp import LlamaCppEngine
from service.engine.paged import PagedEngine
from service.engine.serial import SerialEngine

__all__ = [
    "KEEPALIVE",
    "BatchingEngine",
    "DirectEngine",
    "Done",
    "Engine",
    "Event",
    "Failed",
    "HybridEngine",
    "Job",
    "Keepalive",
    "LlamaCppEngine",
    "PagedEngine",
    "SerialEngine",
    "Started",
    "Token",
    "constraining_engines",
    "generation_config",
    "load_pipeline",
    "logprob_engines",
    "make_engine",
    "pipeline_properties",
    "render_prompt",
]


ENGINES: dict[str, type[Engine]] = {"direct": DirectEngine, "serial": SerialEngine, "batching": BatchingEngine,
                                    "llamacpp": LlamaCppEngine, "hybrid": HybridEngine, "paged": PagedEngine}


def make_engine(settings, *args, **kwargs) -> Engine:
    """The engine VLFLEET_ENGINE names: direct (the sub-models), serial (VLMPipeline), batching
    (ContinuousBatchingPipeline), llamacpp (a llama-server child process), hybrid (the direct engine's vision in
    front of llama.cpp's language model) or paged (the direct engine's sub-models, several conversations stepped
    together over a paged KV cache)."""
    return ENGINES[settings.engine](settings, *args, **kwargs)


def constraining_engines() -> list[str]:
    """The engines that constrain an answer to a response_format (Engine.constrains_output)."""
    return [name for name, engine in ENGINES.items() if engine.constrains_output]


def logprob_engines(top_logprobs: int = 0) -> list[str]:
    """The engines that give token logprobs with ``top_logprobs`` top entries each (Engine.top_logprobs)."""
    return [name for name, engine in ENGINES.items()
            if engine.top_logprobs is not None and engine.top_logprobs >= top_logprobs]

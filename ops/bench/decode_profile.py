"""Where a decode step's time goes: the language model's IR, one token at a time, timed per node by the CPU plugin.

The bandwidth floor (bandwidth.py) is the step's time if every weight streamed at the machine's read bandwidth.
This measures how fast each part's weights do stream: the lm_head's matmul, the decoder layers' compressed
matmuls, attention over the KV cache, and the rest. The plugin's per-node counters (PERF_COUNT) add up to more
than the step's wall time, so each part's share of the counters is applied to the step's median wall time.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from ops.bench.bandwidth import LANGUAGE_MODEL_XML

MATMULS = ("FullyConnected", "FullyConnectedCompressed", "MatMul")


def part_of(node_type: str, node_name: str) -> str:
    if node_type in MATMULS:
        return "lm_head" if "lm_head" in node_name else "matmuls"
    if node_type.startswith("ScaledDotProductAttention"):
        return "attention"
    return "other"


@dataclass
class DecodeProfile:
    ms_per_token: float  # median wall time of the timed steps
    shares: dict[str, float]  # part -> share of the plugin's counters
    kernels: list[str]  # the matmuls' implementations the plugin picked on this CPU
    prompt_tokens: int
    steps: int

    def ms(self, part: str) -> float:
        return self.shares.get(part, 0.0) * self.ms_per_token

    def stream_rates(self, weights: dict) -> dict[str, float]:
        """Bytes/s each part's weights stream at, from ``WeightBytes.as_dict()`` of the profiled artifact."""
        return {part: size / (self.ms(part) / 1000) for part, size in weights_by_part(weights).items()
                if self.ms(part) > 0}

    def as_dict(self) -> dict:
        return asdict(self)


def weights_by_part(weights: dict) -> dict[str, int]:
    """Bytes each weight-reading part reads per step (``WeightBytes.as_dict()``): the lm_head's, and every other
    constant of the language model, which is the decoder's matmuls' weights."""
    return {"lm_head": weights["lm_head"], "matmuls": weights["total"] - weights["lm_head"]}


def service_lm_properties(artifact: Path) -> dict:
    """What the direct engine, started from this environment on ``artifact``, compiles its language model with (the
    compiled-model cache left out: the profile compiles afresh)."""
    import os

    from service.engine.genai import split_properties
    from service.runtime import settings

    _, properties = split_properties(settings.load({**os.environ, "VLFLEET_MODEL_DIR": str(artifact)}))
    properties.pop("CACHE_DIR", None)
    return properties


def profile_decode(artifact: Path, properties: dict, prompt_tokens: int = 150, steps: int = 24,
                   warmup: int = 4) -> DecodeProfile:
    """Prefill ``prompt_tokens`` random embeddings, then time ``steps`` single-token steps after ``warmup``."""
    import numpy as np
    import openvino as ov

    config = json.loads((artifact / "config.json").read_text())
    hidden = config.get("text_config", config)["hidden_size"]
    deepstack = len(config.get("vision_config", {}).get("deepstack_visual_indexes", ()))
    compiled = ov.Core().compile_model(artifact / LANGUAGE_MODEL_XML, "CPU", {**properties, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)

    def step(past: int, n: int) -> None:
        request.infer({
            "inputs_embeds": rng.standard_normal((1, n, hidden), dtype=np.float32) * 0.02,
            "attention_mask": np.ones((1, past + n), np.int64),
            "position_ids": np.tile(np.arange(past, past + n, dtype=np.int64), (3, 1, 1)),
            "visual_pos_masks": np.zeros((1, n), bool),
            "deepstack_visual_embeds": np.zeros((deepstack, n, hidden), np.float32),  # no image token: zeros
            "beam_idx": np.zeros(1, np.int32)})

    step(0, prompt_tokens)
    wall, counters, kernels = [], Counter(), set()
    for i in range(warmup + steps):
        begin = time.perf_counter()
        step(prompt_tokens + i, 1)
        wall.append(time.perf_counter() - begin)
        if i < warmup:
            continue
        for node in request.profiling_info:
            part = part_of(node.node_type, node.node_name)
            counters[part] += node.real_time.total_seconds()
            if part in ("lm_head", "matmuls"):
                kernels.add(f"{node.node_type}: {node.exec_type}")
    total = sum(counters.values())
    return DecodeProfile(1000 * statistics.median(wall[warmup:]), {p: t / total for p, t in sorted(counters.items())},
                         sorted(kernels), prompt_tokens, steps)

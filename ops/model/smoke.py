"""Smoke test of an artifact: load it with openvino_genai.VLMPipeline and generate a few tokens from an image."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SmokeResult:
    text: str
    tokens: int
    load_s: float
    generate_s: float


def smoke(directory: Path, max_new_tokens: int = 4, device: str = "CPU") -> SmokeResult:
    """Load the artifact and generate exactly ``max_new_tokens`` tokens for a grey 64x64 image."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    started = time.monotonic()
    pipe = openvino_genai.VLMPipeline(str(directory), device)
    loaded = time.monotonic()
    config = openvino_genai.GenerationConfig()
    # Fixed length: a random-weight model may emit end-of-sequence at once, which would prove nothing.
    config.max_new_tokens = config.min_new_tokens = max_new_tokens
    image = ov.Tensor(np.full((1, 64, 64, 3), 128, dtype=np.uint8))
    result = pipe.generate("Describe the image in one sentence.", images=[image], generation_config=config)
    return SmokeResult(result.texts[0], result.perf_metrics.get_num_generated_tokens(), loaded - started,
                       time.monotonic() - loaded)

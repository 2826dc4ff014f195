"""The machine's limit for the first token: the prompt's matrix multiplications at the best rate this CPU reaches.

Before the first token the service runs the vision transformer over every patch of the image and the language
model over every prompt token: both are matrix multiplications whose weights stay in cache across many rows, so
they are bound by arithmetic, not by memory. The floor is their FLOPs (counted from the model's config) over the
best matmul throughput OpenVINO's CPU kernels reach on this machine, measured on the model's own layer shapes with
each weight format and precision the service could use. Normalisation, activations and image preparation are left
out, so the floor is a lower bound: no engine built on these kernels can give a first token below it.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import asdict, dataclass

from ops.bench.stats import best_rate

REPEATS = 6  # timed runs per kernel, after one warm-up; the fastest counts


@dataclass(frozen=True)
class FlopModel:
    """Multiply-accumulate weights per row of each part, from a Qwen3-VL config (dense layers, no biases)."""

    lm_weights: int  # per prompt token: every decoder layer's projections
    lm_layers: int
    lm_attention_width: int  # query heads x head dim
    lm_head_weights: int  # vocab x hidden: only the last prompt token's logits are computed
    vision_weights: int  # per patch: every vision block's projections and the patch embedding
    vision_layers: int
    vision_hidden: int
    merger_weights: int  # per image token (merge x merge patches): the merger and each deepstack merger
    merge: int

    @classmethod
    def of_config(cls, config: dict) -> FlopModel:
        text, vision = config.get("text_config", config), config["vision_config"]
        hidden, inter, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
        head_dim = text.get("head_dim") or hidden // text["num_attention_heads"]
        q, kv = text["num_attention_heads"] * head_dim, text["num_key_value_heads"] * head_dim
        per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter  # q, k, v, o; gate, up, down
        vh, merge = vision["hidden_size"], vision["spatial_merge_size"]
        patch_in = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2
        vision_block = 4 * vh * vh + 2 * vh * vision["intermediate_size"]  # qkv, proj; fc1, fc2
        merged = vh * merge * merge
        mergers = 1 + len(vision.get("deepstack_visual_indexes", ()))
        return cls(lm_weights=layers * per_layer, lm_layers=layers, lm_attention_width=q,
                   lm_head_weights=hidden * text["vocab_size"],
                   vision_weights=vision["depth"] * vision_block + patch_in * vh, vision_layers=vision["depth"],
                   vision_hidden=vh, merger_weights=mergers * (merged * merged + merged * vision["out_hidden_size"]),
                   merge=merge)

    def vision_flops(self, patches: int) -> float:
        """The vision tower over one image: every patch attends to every other (no mask)."""
        tokens = patches // (self.merge * self.merge)
        attention = 4 * patches * patches * self.vision_hidden * self.vision_layers  # scores and values
        return 2.0 * (self.vision_weights * patches + self.merger_weights * tokens) + attention

    def language_flops(self, prompt_tokens: int) -> float:
        """Prefill: every prompt token through every layer; causal attention touches half the score matrix."""
        attention = 2 * prompt_tokens * prompt_tokens * self.lm_attention_width * self.lm_layers
        return 2.0 * (self.lm_weights * prompt_tokens + self.lm_head_weights) + attention


@dataclass(frozen=True)
class Kernel:
    name: str  # weight format and compute precision, e.g. "int8 weights, f32, dynamic quantisation groups of 128"
    shape: tuple[int, int, int]  # rows x input width x output width
    flops_per_s: float

    def as_dict(self) -> dict:
        return asdict(self)


# (weights, INFERENCE_PRECISION_HINT, DYNAMIC_QUANTIZATION_GROUP_SIZE or None for the plugin's default): int4/int8
# weights with an f32 hint take the plugin's dynamic quantisation (activations to int8, VNNI / AMX-INT8 where the CPU
# has them); bf16 uses AVX512_BF16 / AMX-BF16 where present.
VARIANTS = (("fp32", "f32", None), ("fp32", "bf16", None), ("int8", "f32", None), ("int8", "f32", 128),
            ("int8", "bf16", None), ("int4", "f32", None), ("int4", "f32", 128), ("int4", "bf16", None))


def _matmul_model(rows: int, width: int, out: int, weights: str):
    import nncf
    import numpy as np
    import openvino as ov
    import openvino.opset13 as opset

    x = opset.parameter(ov.PartialShape([1, -1, width]), np.float32, name="x")
    w = np.random.default_rng(0).standard_normal((out, width)).astype(np.float32) * 0.02
    model = ov.Model([opset.matmul(x, opset.constant(w), False, True)], [x])
    if weights == "fp32":
        return model
    # nncf writes the compressed-weight pattern the plugin recognises, as the converter does for the artifacts.
    nncf.set_log_level(logging.ERROR)
    mode = nncf.CompressWeightsMode.INT8_ASYM if weights == "int8" else nncf.CompressWeightsMode.INT4_ASYM
    kwargs = {"group_size": 128, "ratio": 1.0} if weights == "int4" else {}
    with contextlib.redirect_stdout(io.StringIO()):  # its progress bar: the bench prints its own line per kernel
        return nncf.compress_weights(model, mode=mode, **kwargs)


def time_matmul(rows: int, width: int, out: int, weights: str, precision: str, dq_group: int | None = None,
                repeats: int = REPEATS) -> float:
    """FLOP/s of the fastest of ``repeats`` runs (after one warm-up) of x(rows, width) @ W(out, width)^T."""
    import numpy as np
    import openvino as ov

    properties: dict = {"INFERENCE_PRECISION_HINT": precision}
    if dq_group is not None:
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = dq_group
    compiled = ov.Core().compile_model(_matmul_model(rows, width, out, weights), "CPU", properties)
    request = compiled.create_infer_request()
    x = np.random.default_rng(1).standard_normal((1, rows, width)).astype(np.float32)
    request.infer({0: x})
    return best_rate(lambda: request.infer({0: x}), repeats, 2.0 * rows * width * out)


def layer_shapes(config: dict, rows: int = 512) -> list[tuple[int, int, int]]:
    """The MLP input projections of the language model and of the vision tower: the prompt's largest matmuls."""
    text, vision = config.get("text_config", config), config["vision_config"]
    return [(rows, text["hidden_size"], text["intermediate_size"]),
            (rows, vision["hidden_size"], vision["intermediate_size"])]


def measure_kernels(config: dict, say=lambda _m: None) -> list[Kernel]:
    kernels = []
    for shape in layer_shapes(config):
        for weights, precision, dq_group in VARIANTS:
            rate = time_matmul(*shape, weights, precision, dq_group)
            name = f"{weights} weights, {precision}"
            if dq_group:
                name += f", dynamic quantisation groups of {dq_group}"
            kernels.append(Kernel(name, shape, rate))
            say(f"matmul {'x'.join(map(str, shape))} {name}: {rate / 1e9:.0f} GFLOP/s")
    return kernels


def first_token_floor(flop_model: FlopModel, peak_flops_per_s: float, patches: int, prompt_tokens: int) -> dict:
    vision, language = flop_model.vision_flops(patches), flop_model.language_flops(prompt_tokens)
    return {"patches": patches, "prompt_tokens": prompt_tokens, "vision_flops": vision, "language_flops": language,
            "peak_flops_per_s": peak_flops_per_s, "seconds": (vision + language) / peak_flops_per_s}

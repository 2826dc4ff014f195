"""The first token's compute floor: FLOPs counted from the config, matmul throughput measured on this CPU."""

from __future__ import annotations

import json
import math
import struct

import pytest

from ops.bench import compute
from ops.bench.bench_md import render
from ops.bench.targets import evaluate
from tests.unit.test_bench_targets import by_id, results


def matrices(checkpoint) -> dict[str, int]:
    """Elements of every weight matrix (2 dims or more: no norms, no biases) of the safetensors file, by name,
    read from its header alone."""
    with open(checkpoint / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return {name: math.prod(t["shape"]) for name, t in header.items()
            if name != "__metadata__" and len(t["shape"]) >= 2}


def test_flop_model_counts_every_projection_of_the_checkpoint(tiny_checkpoint):
    """The config arithmetic against the checkpoint's own tensors: a layer it forgot or counted twice fails here."""
    flops = compute.FlopModel.of_config(json.loads((tiny_checkpoint / "config.json").read_text()))
    weights = matrices(tiny_checkpoint)

    def total(*prefixes: str) -> int:
        return sum(v for n, v in weights.items() if n.startswith(prefixes))

    assert flops.lm_weights == total("model.language_model.layers.")
    assert flops.lm_head_weights == total("model.language_model.embed_tokens.")  # tied embeddings
    assert flops.vision_weights == total("model.visual.blocks.", "model.visual.patch_embed.")
    assert flops.merger_weights == total("model.visual.merger.", "model.visual.deepstack_merger_list.")
    assert sum(weights.values()) == total("model.language_model.", "model.visual.")  # nothing else to count


def test_flops_grow_with_the_prompt_and_the_image():
    config = {"text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100},
              "vision_config": {"hidden_size": 32, "intermediate_size": 64, "depth": 2, "spatial_merge_size": 2,
                                "temporal_patch_size": 2, "patch_size": 4, "out_hidden_size": 64,
                                "deepstack_visual_indexes": [0]}}
    f = compute.FlopModel.of_config(config)
    # One token: two FLOPs per weight (and the logits once), plus its attention to itself.
    assert f.language_flops(1) == 2 * (f.lm_weights + f.lm_head_weights) + 2 * f.lm_attention_width * f.lm_layers
    # Attention is quadratic: twice the tokens cost more than twice the FLOPs, minus the one-off logits.
    assert f.language_flops(200) - f.lm_head_weights * 2 > 2 * (f.language_flops(100) - f.lm_head_weights * 2)
    assert f.vision_flops(64) > 2 * f.vision_flops(32) - 1
    floor = compute.first_token_floor(f, 1e9, 64, 30)
    assert floor["seconds"] == pytest.approx((f.vision_flops(64) + f.language_flops(30)) / 1e9)


@pytest.mark.parametrize(("weights", "dq_group"), [("fp32", None), ("int8", None), ("int4", 128)])
def test_matmul_throughput_is_measured_on_the_real_kernels(weights, dq_group):
    rate = compute.time_matmul(64, 256, 256, weights, "f32", dq_group, repeats=2)
    assert math.isfinite(rate) and rate > 0


def compute_results() -> dict:
    r = results()
    f = compute.FlopModel.of_config({"text_config": {"hidden_size": 2048, "intermediate_size": 6144,
                                                     "num_hidden_layers": 28, "num_attention_heads": 16,
                                                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
                                     "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "depth": 24,
                                                       "spatial_merge_size": 2, "temporal_patch_size": 2,
                                                       "patch_size": 16, "out_hidden_size": 2048,
                                                       "deepstack_visual_indexes": [5, 11, 17]}})
    peak = compute.Kernel("int8 weights, f32", (512, 2048, 6144), 4e11)
    r["machine_limit"]["compute"] = {"kernels": [peak.as_dict()], "peak": peak.as_dict(),
                                     "first_token": compute.first_token_floor(f, peak.flops_per_s, 468, 149)}
    return r


def test_first_token_targets_name_the_compute_floor():
    r = compute_results()
    floor = r["machine_limit"]["compute"]["first_token"]["seconds"]
    t = by_id(evaluate(r))
    assert f"{floor:.2f} s = {floor / 6.0:.2f}x" in t["first-vs-fp32"].detail
    assert f"{floor:.2f} s" in t["first-abs"].detail
    assert by_id(evaluate(results()))["first-vs-fp32"].detail == ""  # no machine section: no floor named


def test_report_shows_the_kernels_and_the_floor():
    r = compute_results()
    md = render(r)
    floor = r["machine_limit"]["compute"]["first_token"]
    assert "| int8 weights, f32 | 512x2048x6144 | 400 |" in md
    assert f"{floor['seconds']:.2f}" in md and "468 image patches" in md and "149 prompt tokens" in md

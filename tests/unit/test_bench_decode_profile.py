"""Where a decode step's time goes: parts of the plugin's counters, and the rates each part's weights stream at."""

from __future__ import annotations

import pytest

from ops.bench.bench_md import render
from ops.bench.decode_profile import DecodeProfile, part_of, service_lm_properties
from ops.bench.targets import evaluate
from tests.unit.test_bench_targets import by_id, results


@pytest.mark.parametrize(("node_type", "name", "part"), [
    ("FullyConnectedCompressed", "__module.lm_head/ov_ext::linear/MatMul", "lm_head"),
    ("FullyConnectedCompressed", "__module.model.language_model.layers.3.mlp.up_proj/ov_ext::linear/MatMul",
     "matmuls"),
    ("MatMul", "__module.model.language_model.layers.0.self_attn/MatMul", "matmuls"),
    ("ScaledDotProductAttentionWithKVCache", "__module.model.language_model.layers.0.self_attn/SDPA", "attention"),
    ("RMS", "__module.model.language_model.norm/RMS", "other"),
])
def test_nodes_fall_into_parts(node_type, name, part):
    assert part_of(node_type, name) == part


def test_the_language_model_compiles_with_its_own_properties_over_the_global_ones(monkeypatch, tmp_path):
    for name, value in {"VLFLEET_PRECISION": "bf16", "VLFLEET_LM_PRECISION": "f32", "VLFLEET_DQ_GROUP_SIZE": "128",
                        "VLFLEET_MODEL_CACHE_DIR": str(tmp_path / "c")}.items():
        monkeypatch.setenv(name, value)
    assert service_lm_properties(tmp_path) == {"INFERENCE_PRECISION_HINT": "f32",
                                               "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128}


def profile() -> DecodeProfile:
    return DecodeProfile(50.0, {"attention": 0.05, "lm_head": 0.2, "matmuls": 0.7, "other": 0.05},
                         ["FullyConnectedCompressed: brgemm_avx512_f32"], 150, 24)


def test_each_part_streams_its_own_weights_in_its_share_of_the_step():
    rates = profile().stream_rates({"total": 1.0e9, "lm_head": 0.3e9})
    assert rates["lm_head"] == pytest.approx(0.3e9 / 0.010)  # 20 % of 50 ms
    assert rates["matmuls"] == pytest.approx(0.7e9 / 0.035)
    assert set(rates) == {"lm_head", "matmuls"}


def test_the_decode_target_and_the_report_name_the_kernels_streaming_rate():
    r = results()
    p = profile()
    r["machine_limit"]["decode"] = p.as_dict() | {
        "stream_bytes_per_s": p.stream_rates(r["machine_limit"]["weights"]["int4"])}
    rate = 0.734e9 / 0.035
    detail = by_id(evaluate(r))["tpot-vs-floor"].detail
    assert f"{rate / 1e9:.1f} GB/s = {rate / 26e9:.2f}x the read bandwidth" in detail
    text = render(r)
    assert "| decoder layers' matmuls | 70 % | 35.0 | 0.73 | 21.0 | 0.81x |" in text
    assert "| attention over the KV cache | 5 % | 2.5 |  |  |  |" in text
    assert "brgemm_avx512_f32" in text


def test_runs_without_a_decode_profile_render_as_before():
    assert "decoder layers' matmuls" not in render(results())
    assert "stream their weights" not in by_id(evaluate(results()))["tpot-vs-floor"].detail

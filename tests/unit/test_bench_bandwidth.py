"""Bandwidth-floor arithmetic: bytes read per token from an IR's constants, and the floor they imply."""

from __future__ import annotations

import pytest

from ops.bench.bandwidth import floor_ms_per_token, ir_weight_bytes, kv_bytes_per_token

IR = """<?xml version="1.0"?>
<net name="lm" version="11">
  <layers>
    <layer id="0" name="inputs_embeds" type="Parameter" version="opset1">
      <data shape="?,?,2048" element_type="f32"/></layer>
    <layer id="1" name="w_q" type="Const" version="opset1">
      <data element_type="u4" shape="2048, 16, 128" offset="0" size="2097152"/></layer>
    <layer id="2" name="w_q_scale" type="Const" version="opset1">
      <data element_type="f16" shape="2048, 16, 1" offset="2097152" size="65536"/></layer>
    <layer id="3" name="w_q_shared" type="Const" version="opset1">
      <data element_type="u4" shape="2048, 16, 128" offset="0" size="2097152"/></layer>
    <layer id="4" name="lm_head" type="Const" version="opset1">
      <data element_type="u8" shape="1000, 2048" offset="2162688" size="2048000"/></layer>
    <layer id="5" name="lm_head_scale" type="Const" version="opset1">
      <data element_type="f16" shape="1000, 1" offset="4210688" size="2000"/></layer>
    <layer id="6" name="axis" type="Const" version="opset1">
      <data element_type="i64" shape="1" offset="4212688" size="8"/></layer>
    <layer id="7" name="matmul" type="MatMul" version="opset1"/>
  </layers>
</net>
"""


def test_constants_counted_once_and_grouped_by_type():
    w = ir_weight_bytes(IR, vocab_size=1000)
    assert w.by_type == {"f16": 65536 + 2000, "i64": 8, "u4": 2097152, "u8": 2048000}
    assert w.total == 2097152 + 65536 + 2048000 + 2000 + 8
    assert w.constants == 5  # the shared blob (same offset and size) is read once


def test_lm_head_is_the_vocab_sized_constants():
    assert ir_weight_bytes(IR, vocab_size=1000).lm_head == 2048000 + 2000
    assert ir_weight_bytes(IR).lm_head == 0


def test_floor_is_bytes_over_bandwidth():
    # 1.044 GB per token at 25 GB/s: 41.76 ms per token.
    assert floor_ms_per_token(1.044e9, 25e9) == pytest.approx(41.76)
    with pytest.raises(ValueError):
        floor_ms_per_token(1e9, 0)


def test_kv_bytes_per_token_for_the_2b_shape():
    config = {"text_config": {"num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128,
                              "hidden_size": 2048, "num_attention_heads": 16}}
    # K and V, 28 layers, 8 heads x 128, one byte each, 256 tokens of context.
    assert kv_bytes_per_token(config, 256) == 2 * 28 * 8 * 128 * 256


def test_bandwidth_measurement_on_a_small_array_is_positive():
    from ops.bench.bandwidth import measure_bandwidth

    bw = measure_bandwidth(gib=1 / 64, passes=2, threads=2)
    assert bw.one_thread > 0 and bw.all_threads > 0
    assert bw.array_bytes == 2**30 // 64 and bw.threads == 2

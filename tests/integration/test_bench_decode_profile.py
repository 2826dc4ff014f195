"""The decode profile on a real converted model: the plugin's counters fall into parts, the lm_head among them."""

from __future__ import annotations

import pytest

from ops.bench.bandwidth import artifact_weight_bytes
from ops.bench.decode_profile import profile_decode, service_lm_properties


def test_a_decode_step_of_the_tiny_model_is_profiled_by_part(tiny_model):
    p = profile_decode(tiny_model, service_lm_properties(tiny_model), prompt_tokens=20, steps=4, warmup=1)
    assert sum(p.shares.values()) == pytest.approx(1.0)
    # The lm_head is found by name: a converter that renamed it would fold it into the layers' matmuls here.
    assert p.shares["lm_head"] > 0 and p.shares["matmuls"] > 0 and p.shares.get("attention", 0) > 0
    assert p.ms_per_token > 0 and p.kernels
    rates = p.stream_rates(artifact_weight_bytes(tiny_model).as_dict())
    assert set(rates) == {"lm_head", "matmuls"} and all(r > 0 for r in rates.values())

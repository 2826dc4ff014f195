"""The project's llama-server on a CI-sized model that takes the 2b shape's CPU kernel paths (issue 30).

A crash in one of ggml's CPU kernels only shows on a model whose matmuls reach it. Which kernel a matrix takes is
picked at load from its type and sizes (llama.cpp's ggml/src/ggml-cpu/repack.cpp
``ggml_repack_get_optimal_repack_type``): on an AVX2 CPU a Q4_0 matrix whose rows come in multiples of 8 is repacked
(the CPU_REPACK buffer, the q4_0_8x8 gemm/gemv kernels), and the type is llama-quantize's choice: the tied
embedding/output matrix is Q6_K only when its rows are a multiple of 256 (else Q8_0, as for the tiny shape). A build
with ggml's AMX kernels puts the same Q4_0 matrices in an AMX buffer instead (ggml-cpu/amx/amx.cpp: rows and
columns in multiples of 32), which is what died of SIGILL on this project's Xeon with the 2b shape, and with the
"kernels" shape too.

The "kernels" synthetic shape (ops.model.synth) meets those conditions as 2b does, at 4 MB: this test loads it with
the project's build (the suite's, ops.llamacpp.build.test_config), answers one token (ops.bench.llama_server.smoke)
and checks from llama-server's verbose log that every Q4_0 matrix is in the repacked buffer and the types are 2b's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.model.synth import SHAPES, Shape

MiB = 1024 * 1024
Q4_0_BYTES_PER_WEIGHT = 18 / 32  # a block: 32 4-bit weights and one f16 scale
TWO_B_TYPES = {"f32", "q4_0", "q6_K"}  # the 2b shape's GGUF as llama-server's log lists it (results/llamacpp-amx)


def q4_0_matrices(shape: Shape) -> list[tuple[int, int]]:
    """(columns, rows) of every Q4_0 matrix of the language model: each layer's attention and MLP projections."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    layer = [(shape.hidden, q), (shape.hidden, kv), (shape.hidden, kv), (q, shape.hidden),
             (shape.hidden, shape.intermediate), (shape.hidden, shape.intermediate), (shape.intermediate, shape.hidden)]
    return layer * shape.layers


def repack_conditions(shape: Shape) -> dict[str, bool]:
    """repack.cpp's and llama-quantize's conditions on ``shape``'s sizes, which pick the kernels an AVX2 CPU runs."""
    return {"every Q4_0 matrix repacked (rows % 8)": all(rows % 8 == 0 for _, rows in q4_0_matrices(shape)),
            "Q4_0 columns in whole blocks (% 32)": all(cols % 32 == 0 for cols, _ in q4_0_matrices(shape)),
            "output matrix Q6_K (hidden % 256)": shape.hidden % 256 == 0}


@pytest.fixture(scope="module")
def kernels_gguf() -> Path:
    """The "kernels" shape as the default GGUF artifact (Q4_0 + mmproj q8_0): about a minute to build, then cached."""
    from ops.llamacpp import build, gguf

    return gguf.cached("kernels", build_config=build.test_config())


def test_the_kernels_shape_meets_the_2b_shapes_kernel_conditions():
    assert repack_conditions(SHAPES["kernels"]) == repack_conditions(SHAPES["2b"])
    assert all(repack_conditions(SHAPES["2b"]).values())
    assert not all(repack_conditions(SHAPES["tiny"]).values())  # its output matrix falls back to Q8_0
    # 2b's repacked buffer as its log shows it (756.00 MiB): the sum of these matrices, so all of them are repacked
    assert round(sum(c * r for c, r in q4_0_matrices(SHAPES["2b"])) * Q4_0_BYTES_PER_WEIGHT / MiB, 2) == 756.0


def test_llama_server_runs_the_kernels_shape_on_the_2b_shapes_kernels(llama_server, kernels_gguf, tmp_path):
    from ops.bench import llama_server as peer
    from ops.machine import describe

    result = peer.smoke(llama_server, kernels_gguf, tmp_path / "smoke.log", ready_timeout=120, timeout=120)
    assert result["ok"] and result["prompt_tokens"] > 0, result
    assert set(result["types"]) == TWO_B_TYPES, result["types"]
    assert result["types"]["q4_0"] == len(q4_0_matrices(SHAPES["kernels"]))
    if "avx2" not in describe()["isa"]:
        pytest.skip("repack.cpp repacks Q4_0 for AVX2 (x86) only; this CPU runs the plain kernels")
    assert "AMX" not in result["buffers"] and "CPU_REPACK" in result["buffers"], result["buffers"]
    expected = sum(c * r for c, r in q4_0_matrices(SHAPES["kernels"])) * Q4_0_BYTES_PER_WEIGHT / MiB
    assert result["buffer_mib"]["CPU_REPACK"] == pytest.approx(expected, abs=0.01), result["buffer_mib"]

"""`vlfleet model.*`: make, convert and check model artifacts."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit, task


@task(help={
    "shape": "tiny (seconds to convert and run; for tests) or 2b (the real Qwen3-VL-2B shape; for benchmarks)",
    "out": "directory to write the Hugging Face checkpoint into (must be empty or absent)",
    "seed": "random seed for weights and filler vocabulary (default 0)",
})
def synth(c, out, shape="tiny", seed=0):
    """Write a synthetic Qwen3-VL checkpoint (random weights, Qwen tokenizer layout, no hub)."""
    from ops.model.synth import SHAPES, synthesize

    if shape not in SHAPES:
        raise Exit(f"--shape must be one of: {', '.join(SHAPES)}")
    try:
        path = synthesize(shape, Path(out), seed=int(seed))
    except FileExistsError as e:
        raise Exit(str(e)) from e
    print(f"synthetic {shape} checkpoint written to {path}")


@task(help={
    "source": "Hugging Face checkpoint directory",
    "out": "artifact directory to create",
    "weight_format": "int4 (default), int8 or fp16",
    "group_size": "int4 group size (default 128; -1 = per channel)",
    "ratio": "int4: share of layers in int4, the rest int8 (default 1.0)",
    "sym": "int4: symmetric quantisation",
})
def convert(c, source, out, weight_format="int4", group_size=128, ratio=1.0, sym=False):
    """Convert a checkpoint to OpenVINO IR with optimum-cli (atomic: no partial artifact on failure)."""
    from ops.model.convert import ConvertParams
    from ops.model.convert import convert as run_convert

    try:
        params = ConvertParams(weight_format, int(group_size), float(ratio), bool(sym))
        path = run_convert(Path(source), Path(out), params)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        raise Exit(f"model.convert: {e}") from e
    print(f"OpenVINO artifact written to {path}")

"""`vlfleet model.*`: fetch checkpoints, convert them once, check the artifacts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from invoke import Exit, task

_SOURCE_HELP = ("Hugging Face repo id (default Qwen/Qwen3-VL-2B-Instruct; mirror via HF_ENDPOINT), checkpoint "
                "directory, http(s)/file URL or path of a checkpoint tarball")
_FORMAT_HELP = {
    "weight_format": "int4 (default), int8 or fp16",
    "group_size": "int4 group size (default 128; -1 = per channel: faster decode, coarser; docs/tuning.md, levers)",
    "ratio": "int4: share of layers in int4, the rest int8 (default 1.0)",
    "sym": "int4: symmetric quantisation",
}
_FETCH_HELP = {
    "source": _SOURCE_HELP,
    "revision": "hub commit (40 hex) to pin; a branch such as 'main' (the default) works but is warned about",
    "endpoint": "hub mirror URL (default: $HF_ENDPOINT, else huggingface.co)",
    "token_file": "file holding the hub token (default: $HF_TOKEN); never printed",
    "sha256": "expected sha256 of a tarball source",
}


def _params(weight_format, group_size, ratio, sym):
    from ops.model.convert import ConvertParams

    try:
        return ConvertParams(weight_format, int(group_size), float(ratio), bool(sym))
    except ValueError as e:
        raise Exit(f"bad conversion parameters: {e}") from e


@task(help={
    "shape": "tiny (seconds to convert and run; for tests), kernels (small, but llama.cpp takes 2b's CPU kernels on "
             "it) or 2b (the real Qwen3-VL-2B shape; for benchmarks)",
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


@task(help={**_FETCH_HELP, "out": "directory to put the checkpoint in (default: under the vlfleet cache)",
            "refresh": "download a URL source again even if the cache has it"})
def fetch(c, source="Qwen/Qwen3-VL-2B-Instruct", revision=None, out=None, endpoint=None, token_file=None,
          sha256=None, refresh=False):
    """Fetch a checkpoint (resumable, progress shown); prints its directory and resolved revision."""
    from ops.model.fetch import FetchError
    from ops.model.fetch import fetch as run_fetch

    try:
        got = run_fetch(source, revision, out=Path(out) if out else None, endpoint=endpoint, token_file=token_file,
                        sha256=sha256, refresh=refresh)
    except FetchError as e:
        raise Exit(f"model.fetch: {e}") from e
    print(f"checkpoint: {got.path}\nsource: {got.origin['kind']} {got.origin['uri']} @ {got.origin['revision']}")


@task(help={"source": "Hugging Face checkpoint directory (from model.fetch or model.synth)",
            "out": "artifact directory to create", **_FORMAT_HELP})
def convert(c, source, out, weight_format="int4", group_size=128, ratio="1.0", sym=False):
    """Convert a checkpoint to an OpenVINO IR artifact with manifest.json (atomic; never overwrites)."""
    from ops.model.convert import GroupSizeError
    from ops.model.convert import convert as run_convert

    params = _params(weight_format, group_size, ratio, sym)
    try:
        path = run_convert(Path(source), Path(out), params)
    except (FileNotFoundError, FileExistsError, GroupSizeError) as e:
        raise Exit(f"model.convert: {e}") from e
    except subprocess.CalledProcessError as e:
        raise Exit(f"model.convert: optimum-cli export failed (exit {e.returncode}; its output is above); no "
                   "artifact was written") from e
    print(f"OpenVINO artifact written to {path}")


def _verify_or_exit(path: Path, smoke: bool, cheap: bool = False, report=None) -> None:
    from service.runtime.manifest import verify as run_verify

    started = time.monotonic()
    report = report or run_verify(path, full=not cheap)
    print(json.dumps({**report.to_dict(), "seconds": round(time.monotonic() - started, 2)}, indent=2))
    if not report.ok:
        raise Exit(f"model.verify: {path} does not match its manifest: " + "; ".join(report.problems()))
    if smoke:
        from ops.model.smoke import smoke as run_smoke

        try:
            result = run_smoke(path)
        except RuntimeError as e:
            raise Exit(f"model.verify --smoke: VLMPipeline could not load or run {path}: {e}") from e
        print(f"smoke: loaded in {result.load_s:.1f} s, {result.tokens} tokens in {result.generate_s:.1f} s: "
              f"{result.text!r}")


@task(help={"directory": "artifact directory (holds manifest.json)",
            "smoke": "also load it with openvino_genai.VLMPipeline and generate a few tokens",
            "cheap": "check presence and sizes only, no hashing"})
def verify(c, directory, smoke=False, cheap=False):
    """Recompute every file's sha256 and name missing, extra and modified files; exit 1 on problems."""
    _verify_or_exit(Path(directory), smoke, cheap)


@task(help={**_FETCH_HELP, **_FORMAT_HELP, "out": "artifact directory (default: cached under the vlfleet cache)",
            "smoke": "also load the artifact with VLMPipeline and generate a few tokens"})
def build(c, source="Qwen/Qwen3-VL-2B-Instruct", revision=None, out=None, endpoint=None, token_file=None,
          sha256=None, weight_format="int4", group_size=128, ratio="1.0", sym=False, smoke=False):
    """fetch + convert + verify, cached by (source, resolved revision, format, params, tool versions)."""
    from ops.model.build import build as run_build
    from ops.model.fetch import FetchError

    params = _params(weight_format, group_size, ratio, sym)
    try:
        path, report = run_build(source, params, revision=revision, out=Path(out) if out else None, endpoint=endpoint,
                            token_file=token_file, sha256=sha256)
    except FetchError as e:
        raise Exit(f"model.build: {e}") from e
    except (FileNotFoundError, FileExistsError) as e:
        raise Exit(f"model.build: {e}") from e
    except subprocess.CalledProcessError as e:
        raise Exit(f"model.build: optimum-cli export failed (exit {e.returncode}; its output is above)") from e
    _verify_or_exit(path, smoke, report=report)
    print(f"artifact: {path}")


@task(help={"source": "Hugging Face checkpoint directory (from model.fetch or model.synth)",
            "out": "GGUF artifact directory to create",
            "quant": "the language model's type: Q4_0 (default) and the other llama-quantize types (needs "
                     "`vlfleet llamacpp.build`, run here if not yet built), or F16, BF16, F32, Q8_0 (the converter "
                     "writes those itself)",
            "mmproj_type": "the vision projector's type: q8_0 (default), f16, bf16 or f32",
            "output_type": "the vocabulary projection's type (a llama-quantize --quant only): unset, llama-quantize "
                           "keeps Q6_K; Q4_K, Q4_0 and IQ4_NL decode faster on x86 CPUs (repacked kernels) at less "
                           "precision (docs/engines.md)"})
def gguf(c, source, out, quant="Q4_0", mmproj_type="q8_0", output_type=""):
    """Convert a checkpoint to a GGUF artifact for llama.cpp: language model + vision projector + manifest.json."""
    from ops.llamacpp.build import BuildError
    from ops.llamacpp.gguf import GgufError, GgufParams
    from ops.llamacpp.gguf import convert as run_convert
    from ops.llamacpp.source import SourceError

    try:
        params = GgufParams(quant, mmproj_type, output_type or None)
    except ValueError as e:
        raise Exit(f"model.gguf: {e}") from None
    if not (Path(source) / "config.json").is_file():
        raise Exit(f"model.gguf: {source} has no config.json: pass a Hugging Face checkpoint directory (from "
                   "`vlfleet model.fetch` or `vlfleet model.synth`)")
    try:
        quantize = None
        if params.needs_quantize:
            from ops.llamacpp import build as build_mod

            quantize = build_mod.build().binary("llama-quantize")
        path = run_convert(Path(source), Path(out), params, quantize=quantize)
    except (FileNotFoundError, FileExistsError, GgufError, BuildError, SourceError) as e:
        raise Exit(f"model.gguf: {e}") from None
    print(f"GGUF artifact written to {path}")

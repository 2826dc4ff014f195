"""Hugging Face checkpoint -> GGUF artifact for llama.cpp: the language model at a chosen quantisation, the
vision projector (mmproj) beside it, and manifest.json with every file's sha256 (service.runtime.manifest's format).

    <artifact>/language-model-Q4_0.gguf   converter (f16) + llama-quantize, or the converter alone for
                                          F16/BF16/F32/Q8_0
    <artifact>/mmproj-q8_0.gguf           converter --mmproj (it writes f32, f16, bf16 or q8_0 itself)
    <artifact>/manifest.json

The converter is the vendored ``convert_hf_to_gguf.py`` of the same llama.cpp source the server is built from
(ops.llamacpp.source), run through ``hf_to_gguf.py`` (see there for the one pre-tokenizer fallback that
synthetic checkpoints need). Atomic like ops.model.convert: everything is written into a hidden ``.partial``
sibling that is renamed into place after its manifest is written; an existing artifact with the same inputs is
a no-op and one with different content is never overwritten.

Manifest: service.runtime.manifest's helpers write and verify it (``python -m service.runtime.manifest verify DIR
--full`` works on a GGUF artifact). That format gates hosts on ``min_runtime.openvino``, which a GGUF artifact does
not need: it is written as "0" (any), and the llama.cpp requirement is ``min_runtime["llama-cpp-python"]``, the
source version whose converter wrote the files.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ops.llamacpp import source as source_mod
from ops.model.publish import publish, up_to_date
from service.runtime import manifest as mf
from service.runtime.processes import die_with_parent

WRAPPER = Path(__file__).with_name("hf_to_gguf.py")
# Types the converter writes itself (no llama.cpp build needed), by llama-quantize's names.
CONVERTER_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
# Types made from the f16 file by llama-quantize (a built binary). IQ2/IQ3 and lower need an importance matrix.
QUANTIZE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
                  "IQ4_NL", "IQ4_XS")
MMPROJ_TYPES = ("f32", "f16", "bf16", "q8_0")
# The vocabulary projection's type (tied embeddings: the token embedding's), llama-quantize --output-tensor-type.
# Left unset, llama-quantize keeps it at Q6_K for the 4- and 5-bit types, which ggml's CPU backend does not repack
# on x86; Q4_0, Q4_K and IQ4_NL it repacks there (ggml-cpu/repack.cpp), at less precision.
OUTPUT_TYPES = ("Q4_0", "Q4_K", "IQ4_NL", "Q5_K", "Q6_K", "Q8_0", "F16")
# Versions recorded in the manifest: what shapes the bytes of the GGUF files.
TOOLS = ("torch", "transformers", "numpy", "sentencepiece", "safetensors")
PRE_TOKENIZER_FALLBACK = "qwen2"  # for Qwen-family checkpoints whose tokenizer the converter does not know
CONVERT_TIMEOUT_S = 3600.0


class GgufError(RuntimeError):
    """The converter or llama-quantize failed, or a needed tool is missing; the message names the fix."""


@dataclass(frozen=True)
class GgufParams:
    quant: str = "Q4_0"  # the language model's type, llama-quantize's spelling (case-insensitive on input)
    mmproj_type: str = "q8_0"  # the vision projector's, the converter's spelling
    output_type: str | None = None  # OUTPUT_TYPES; None: llama-quantize's own choice

    def __post_init__(self) -> None:
        quant, mmproj = self.quant.upper(), self.mmproj_type.lower()
        output = self.output_type.upper() if self.output_type else None
        if quant not in CONVERTER_TYPES and quant not in QUANTIZE_TYPES:
            raise ValueError(f"quantisation {self.quant!r} is not one of "
                             f"{', '.join((*QUANTIZE_TYPES, *CONVERTER_TYPES))}")
        if mmproj not in MMPROJ_TYPES:
            raise ValueError(f"mmproj type {self.mmproj_type!r} is not one of {', '.join(MMPROJ_TYPES)} "
                             "(the converter writes the vision projector; llama-quantize does not take it)")
        if output is not None and output not in OUTPUT_TYPES:
            raise ValueError(f"output tensor type {self.output_type!r} is not one of {', '.join(OUTPUT_TYPES)}")
        if output is not None and quant in CONVERTER_TYPES:
            raise ValueError(f"an output tensor type is set by llama-quantize, which {quant} does not go through: "
                             f"choose one of {', '.join(QUANTIZE_TYPES)}, or leave the output type unset")
        object.__setattr__(self, "quant", quant)
        object.__setattr__(self, "mmproj_type", mmproj)
        object.__setattr__(self, "output_type", output)

    @property
    def needs_quantize(self) -> bool:
        """True when the language model goes through llama-quantize (a llama.cpp build)."""
        return self.quant not in CONVERTER_TYPES

    @property
    def lm_outtype(self) -> str:
        """What the converter writes for the language model: the final type, or f16 for llama-quantize to read."""
        return CONVERTER_TYPES.get(self.quant, "f16")

    @property
    def lm_type(self) -> str:
        """The language model's type as named in files and labels: the quantisation, and the output's if set."""
        return f"{self.quant}-output-{self.output_type}" if self.output_type else self.quant

    @property
    def lm_file(self) -> str:
        return f"language-model-{self.lm_type}.gguf"

    @property
    def mmproj_file(self) -> str:
        return f"mmproj-{self.mmproj_type}.gguf"

    def label(self) -> str:
        return f"{self.lm_type}-mmproj-{self.mmproj_type}"

    def describe(self) -> dict[str, Any]:
        """The manifest's ``weight_format``."""
        described = {"format": mf.GGUF_FORMAT, "language_model": self.quant, "mmproj": self.mmproj_type,
                     "files": {"language_model": self.lm_file, "mmproj": self.mmproj_file}}
        return {**described, "output": self.output_type} if self.output_type else described


def pre_tokenizer_fallback(source: Path) -> str | None:
    """The fallback name for a Qwen-family checkpoint (the only family the fallback is right for), else None."""
    config = json.loads((Path(source) / "config.json").read_text())
    kinds = [str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures", [])]
    return PRE_TOKENIZER_FALLBACK if any(k.lower().startswith("qwen") for k in kinds) else None


def converter_command(tree: Path, source: Path, outfile: Path, outtype: str, mmproj: bool = False,
                      fallback: str | None = None) -> list[str]:
    cmd = [sys.executable, str(WRAPPER), str(tree)]
    if fallback:
        cmd += ["--pre-tokenizer-fallback", fallback]
    cmd += ["--", str(source), "--outtype", outtype, "--outfile", str(outfile)]
    return cmd + (["--mmproj"] if mmproj else [])


def quantize_command(quantize: Path, f16: Path, out: Path, quant: str, threads: int = 2,
                     output_type: str | None = None) -> list[str]:
    output = ["--output-tensor-type", output_type] if output_type else []
    return [str(quantize), *output, str(f16), str(out), quant, str(threads)]


def tool_versions(source: source_mod.Source) -> dict[str, str]:
    found = {"python": ".".join(map(str, sys.version_info[:3])), "llama-cpp-python": source.version,
             "llama-cpp-python-sdist-sha256": source.sha256}
    for name in TOOLS:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def gguf_manifest(directory: Path, *, origin: Mapping[str, Any], params: GgufParams, tools: Mapping[str, str],
                  pre_tokenizer: str | None) -> dict[str, Any]:
    """manifest.json for a GGUF artifact, by service.runtime.manifest.build_manifest (see the module doc on
    min_runtime)."""
    manifest = mf.build_manifest(directory, source=origin, weight_format=params.describe(), tools=tools,
                                 min_runtime="0")
    manifest["min_runtime"]["llama-cpp-python"] = tools["llama-cpp-python"]
    manifest["gguf"] = {"pre_tokenizer_fallback": pre_tokenizer}
    return manifest


def _same_inputs(manifest: Mapping[str, Any], origin: Mapping[str, Any], params: GgufParams,
                 tools: Mapping[str, str]) -> bool:
    return (manifest.get("source") == dict(origin) and manifest.get("weight_format") == params.describe()
            and manifest.get("tools") == dict(tools))


_BAR = re.compile(r"^\s*([^:|]{1,40}):\s+(\d+)%\|")  # a tqdm progress line ("Writing:  45%|####  | 1.5G/3.4G")


class _Echo:
    """Passes a tool's output on, but a progress bar only every 10 % (tqdm redraws it hundreds of times)."""

    def __init__(self) -> None:
        self.shown: dict[str, int] = {}

    def wanted(self, line: str) -> bool:
        m = _BAR.match(line)
        if not m:
            return True
        label, percent = m.group(1).strip(), int(m.group(2))
        if percent < self.shown.get(label, -10) + 10 and percent != 100:
            return False
        self.shown[label] = percent
        return True


def _run(cmd: list[str], log: Path, echo: bool, timeout: float, what: str) -> str:
    """Run ``cmd`` with its output appended to ``log`` (and echoed unless quiet); its output as text."""

    lines: list[str] = []
    shown = _Echo()
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                preexec_fn=die_with_parent())
        deadline = time.monotonic() + timeout
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                lines.append(line)
                if echo and shown.wanted(line):
                    sys.stderr.write(line)
                if time.monotonic() > deadline:
                    raise GgufError(f"{what} did not finish in {timeout:.0f} s; stopped it (log: {log})")
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            raise
    if proc.returncode != 0:
        tail = "".join(lines[-12:]).rstrip()
        raise GgufError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
    return "".join(lines)


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[gguf] {msg}", file=sys.stderr, flush=True)


def convert(source: Path, out: Path, params: GgufParams, *, quantize: Path | None = None,
            src: source_mod.Source | None = None, quiet: bool = False, origin: Mapping[str, Any] | None = None,
            threads: int = 2, timeout: float = CONVERT_TIMEOUT_S) -> Path:
    """Convert checkpoint ``source`` into GGUF artifact ``out`` (with manifest.json); returns ``out``.

    ``quantize`` is llama-quantize (ops.llamacpp.build), needed only when ``params.needs_quantize``. Raises
    FileNotFoundError for a non-checkpoint source, GgufError when a step fails or llama-quantize is needed and
    not given, FileExistsError when ``out`` holds something else.
    """
    from ops.model.convert import describe_source

    source, out = Path(source), Path(out)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} has no config.json: not a Hugging Face checkpoint directory")
    if params.needs_quantize and (quantize is None or not Path(quantize).is_file()):
        raise GgufError(f"{params.quant} is made by llama-quantize, which is not built: run `vlfleet llamacpp.build` "
                        f"first, or choose --quant {' or '.join(CONVERTER_TYPES)} (the converter writes those)")
    src = src or source_mod.fetch(quiet=quiet)
    out.parent.mkdir(parents=True, exist_ok=True)
    from ops.paths import locked

    with locked(out):
        origin = dict(origin) if origin is not None else describe_source(source)
        tools = tool_versions(src)
        if up_to_date(out, lambda m: _same_inputs(m, origin, params, tools), lambda msg: _log(quiet, msg)):
            return out
        tmp, work = out.with_name(f".{out.name}.partial"), out.with_name(f".{out.name}.work")
        for d in (tmp, work):
            shutil.rmtree(d, ignore_errors=True)  # left by a killed convert
            d.mkdir(parents=True)
        try:
            started = time.monotonic()
            log = work / "convert.log"
            fallback = pre_tokenizer_fallback(source)
            lm_target = (work / "language-model-f16.gguf") if params.needs_quantize else tmp / params.lm_file
            _log(quiet, f"language model: {source} -> {lm_target.name} ({params.lm_outtype}) with the vendored "
                        f"converter of llama-cpp-python {src.version}")
            text = _run(converter_command(src.llama_cpp, source, lm_target, params.lm_outtype, fallback=fallback),
                        log, not quiet, timeout, "the language model's conversion")
            used_fallback = fallback if fallback and _fell_back(text) else None
            if used_fallback:
                _log(quiet, f"the tokenizer's pre-tokenizer is not in the converter's table; wrote "
                            f"tokenizer.ggml.pre = {used_fallback!r} (synthetic checkpoints: see hf_to_gguf.py)")
            if params.needs_quantize:
                _log(quiet, f"llama-quantize {lm_target.name} -> {params.lm_file} ({threads} threads)")
                _run(quantize_command(Path(quantize), lm_target, tmp / params.lm_file, params.quant, threads,
                                      params.output_type), log, not quiet, timeout, "llama-quantize")
                lm_target.unlink()
            _log(quiet, f"vision projector: {source} -> {params.mmproj_file}")
            _run(converter_command(src.llama_cpp, source, tmp / params.mmproj_file, params.mmproj_type, mmproj=True,
                                   fallback=fallback), log, not quiet, timeout, "the vision projector's conversion")
            _log(quiet, f"converted in {time.monotonic() - started:.0f} s; hashing files for the manifest")
            manifest = gguf_manifest(tmp, origin=origin, params=params, tools=tools, pre_tokenizer=used_fallback)
            mf.write_manifest(tmp, manifest)
            if not publish(tmp, out, manifest, lambda msg: _log(quiet, msg)):
                return out
            sizes = ", ".join(f"{n} {e['size'] / 1e9:.2f} GB" for n, e in manifest["files"].items())
            _log(quiet, f"GGUF artifact {manifest['artifact_id']} ({sizes}) written to {out} in "
                        f"{time.monotonic() - started:.0f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    return out


def _fell_back(converter_output: str) -> bool:
    from ops.llamacpp.hf_to_gguf import FALLBACK_MARK

    return FALLBACK_MARK in converter_output


def cached(shape: str, params: GgufParams | None = None, seed: int = 0, quiet: bool = True,
           build_config=None) -> Path:
    """``ops.model.cache.checkpoint(shape)`` as a GGUF artifact, cached under ``$VLFLEET_CACHE/gguf/`` and keyed by
    the checkpoint, the parameters, the source version and this code; llama-quantize (of ``build_config``, default
    the native build) is built first if needed. Its -O level does not change what it writes."""
    from ops.llamacpp import hf_to_gguf
    from ops.model.cache import _code_key, checkpoint
    from ops.paths import cache_root

    params = params or GgufParams()
    src_ckpt = checkpoint(shape, seed)
    key = _code_key(sys.modules[__name__], hf_to_gguf, mf)
    out = cache_root() / "gguf" / f"{src_ckpt.name}-{params.label()}-llama{source_mod.VERSION}-{key}"
    if (out / mf.MANIFEST_NAME).is_file():
        return out
    quantize = None
    if params.needs_quantize:
        from ops.llamacpp import build

        quantize = build.build(build_config).binary("llama-quantize")
    return convert(src_ckpt, out, params, quantize=quantize, quiet=quiet)

"""Hugging Face checkpoint -> OpenVINO IR artifact with the real toolchain (`optimum-cli export openvino`).

Atomic: the export writes into a hidden ``.partial`` sibling that is renamed into place only after it succeeded
and its manifest.json is written, so an interrupted or failed convert never leaves something that looks like an
artifact. The export subprocess dies with us (PR_SET_PDEATHSIG), so a killed convert leaves no orphan writing on.
An existing artifact is never overwritten: converting to it again with the same inputs is a no-op, and a result
with different content is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ops.model.publish import publish, up_to_date
from service.runtime import manifest as mf
from service.runtime.processes import die_with_parent

WEIGHT_FORMATS = ("int4", "int8", "fp16")
# Versions recorded in the manifest: everything that shapes the bytes of the IR.
TOOLS = ("optimum-intel", "optimum", "transformers", "openvino", "openvino-tokenizers", "nncf", "torch")
# Written by ops.model.fetch into checkpoints it extracts, so the manifest can name where they came from.
SOURCE_FILE = "vlfleet-source.json"


@dataclass(frozen=True)
class ConvertParams:
    weight_format: str = "int4"
    group_size: int = 128  # int4 only; -1 = per channel
    ratio: float = 1.0  # int4 only: share of layers in int4, the rest int8
    sym: bool = False  # int4 only

    def __post_init__(self) -> None:
        if self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight format {self.weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")
        if self.group_size != -1 and self.group_size < 1:
            raise ValueError(f"group size must be -1 (per channel) or positive, got {self.group_size}")

    def cli_args(self) -> list[str]:
        args = ["--weight-format", self.weight_format]
        if self.weight_format == "int4":
            args += ["--group-size", str(self.group_size), "--ratio", str(self.ratio)]
            if self.sym:
                args.append("--sym")
        return args

    def describe(self) -> dict[str, Any]:
        """The parameters that matter for this format (the manifest's ``weight_format``)."""
        if self.weight_format == "int4":
            return asdict(self)
        return {"weight_format": self.weight_format}

    def label(self) -> str:
        if self.weight_format != "int4":
            return self.weight_format
        return f"int4-g{self.group_size}-r{self.ratio}" + ("-sym" if self.sym else "")


class GroupSizeError(ValueError):
    """The int4 group size does not divide the language model's layer widths; the message names the ones that do."""


GROUP_SIZES = (16, 32, 64, 128, 256)  # the usual choices; any divisor of every width works


def check_group_size(source: Path, params: ConvertParams) -> None:
    """Refuse, before a minutes-long export, an int4 group size that nncf would reject.

    nncf compresses the language model's linear layers to int4 in groups along their input channels, so every
    input width (hidden size, attention output, MLP intermediate) must be a multiple of the group size. The
    vision tower is compressed to int8 per channel and does not constrain it.
    """
    if params.weight_format != "int4" or params.group_size == -1:
        return
    config = json.loads((Path(source) / "config.json").read_text())
    text = config.get("text_config", config)
    heads, head_dim = text.get("num_attention_heads"), text.get("head_dim")
    widths = {text.get("hidden_size"), text.get("intermediate_size"),
              heads * head_dim if heads and head_dim else None} - {None}
    bad = sorted(w for w in widths if w % params.group_size)
    if bad:
        ok = [g for g in GROUP_SIZES if all(w % g == 0 for w in widths)]
        raise GroupSizeError(
            f"int4 group size {params.group_size} does not divide the language model's layer widths {bad} "
            f"(all widths: {sorted(widths)}); use --group-size {' or '.join(map(str, ok)) or '-1'} "
            "(-1 = per channel also works)")


def optimum_cli() -> str:
    """optimum-cli of the interpreter running us (the converter environment), not whatever is on PATH."""
    candidate = Path(sys.executable).with_name("optimum-cli")
    return str(candidate) if candidate.exists() else "optimum-cli"


def export_command(source: Path, out: Path, params: ConvertParams) -> list[str]:
    return [optimum_cli(), "export", "openvino", "--model", str(source), "--task", "image-text-to-text",
            *params.cli_args(), str(out)]


def tool_versions() -> dict[str, str]:
    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in TOOLS:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def min_runtime(openvino_version: str) -> str:
    """Oldest OpenVINO runtime that loads IR made by ``openvino_version``: the same major.minor release.

    Opsets and the tokenizer extension's operations change between minor releases, not patch releases; older
    runtimes may lack operations the exporter used.
    """
    major, minor = mf.parse_version(openvino_version)[:2]
    return f"{major}.{minor}"


def describe_source(source: Path) -> dict[str, Any]:
    """Where a checkpoint directory came from: fetch's record, a hub cache snapshot, or a plain directory."""
    source = Path(source).absolute()
    record = source / SOURCE_FILE
    if record.is_file():
        return json.loads(record.read_text())
    if source.parent.name == "snapshots" and source.parent.parent.name.startswith("models--"):
        repo = source.parent.parent.name[len("models--"):].replace("--", "/")
        return {"kind": "hf", "uri": repo, "revision": source.name}
    # A plain directory has no revision: its content is its identity.
    return {"kind": "dir", "uri": str(source), "revision": "sha256:" + mf.content_digest(mf.scan(source))}


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    # Serialises converts to one destination (parallel test sessions share the cache).
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[convert] {msg}", file=sys.stderr, flush=True)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _same_inputs(manifest: Mapping[str, Any], source: Mapping[str, Any], params: ConvertParams,
                 tools: Mapping[str, str]) -> bool:
    return (manifest.get("source") == dict(source) and manifest.get("weight_format") == params.describe()
            and manifest.get("tools") == dict(tools))


def convert(source: Path, out: Path, params: ConvertParams, quiet: bool = False,
            origin: Mapping[str, Any] | None = None) -> Path:
    """Convert checkpoint ``source`` into artifact ``out`` (with manifest.json); returns ``out``.

    ``origin`` describes where the checkpoint came from (``ops.model.fetch`` passes it); by default it is
    worked out from the directory. Raises FileNotFoundError for a non-checkpoint source, GroupSizeError for an int4
    group size the model's widths do not allow, FileExistsError when ``out`` holds something else,
    subprocess.CalledProcessError when the export fails.
    """
    source, out = Path(source), Path(out)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} has no config.json: not a Hugging Face checkpoint directory")
    check_group_size(source, params)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        origin = dict(origin) if origin is not None else describe_source(source)
        tools = tool_versions()
        if up_to_date(out, lambda m: _same_inputs(m, origin, params, tools), lambda msg: _log(quiet, msg)):
            return out
        tmp = out.with_name(f".{out.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed convert
        try:
            started = time.monotonic()
            _log(quiet, f"exporting {source} -> {out} ({params.label()}) with optimum-cli; this takes minutes "
                        "for a 2B model")
            subprocess.run(export_command(source, tmp, params), check=True, preexec_fn=die_with_parent(),
                           stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.STDOUT if quiet else None)
            _log(quiet, f"export finished in {time.monotonic() - started:.0f} s; hashing files for the manifest")
            files = mf.scan(tmp)
            manifest = mf.build_manifest(tmp, source=origin, weight_format=params.describe(), tools=tools,
                                         min_runtime=min_runtime(tools["openvino"]), files=files)
            mf.write_manifest(tmp, manifest)
            if not publish(tmp, out, manifest, lambda msg: _log(quiet, msg)):
                return out
            _log(quiet, f"artifact {manifest['artifact_id']} ({_gb(manifest['total_size'])}, {len(files)} files) "
                        f"written to {out} in {time.monotonic() - started:.0f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out

"""Hugging Face checkpoint -> OpenVINO IR with the real toolchain (`optimum-cli export openvino`).

Writes into a temporary sibling directory and renames it into place only on success, so an
interrupted or failed convert never leaves something that looks like an artifact.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

WEIGHT_FORMATS = ("int4", "int8", "fp16")


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

    def cli_args(self) -> list[str]:
        args = ["--weight-format", self.weight_format]
        if self.weight_format == "int4":
            args += ["--group-size", str(self.group_size), "--ratio", str(self.ratio)]
            if self.sym:
                args.append("--sym")
        return args


def optimum_cli() -> str:
    """optimum-cli of the interpreter running us (the converter environment), not whatever is on PATH."""
    candidate = Path(sys.executable).with_name("optimum-cli")
    return str(candidate) if candidate.exists() else "optimum-cli"


def export_command(source: Path, out: Path, params: ConvertParams) -> list[str]:
    return [optimum_cli(), "export", "openvino", "--model", str(source), "--task", "image-text-to-text",
            *params.cli_args(), str(out)]


def convert(source: Path, out: Path, params: ConvertParams, quiet: bool = False) -> Path:
    source, out = Path(source), Path(out)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} has no config.json: not a Hugging Face checkpoint directory")
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run(export_command(source, tmp, params), check=True,
                       stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.STDOUT if quiet else None)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

"""Cached synthetic checkpoints and artifacts, keyed by the code and parameters that make them."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ops.model import convert as convert_mod
from ops.model import synth
from ops.paths import cache_root


def _code_key(*modules) -> str:
    h = hashlib.sha256()
    for mod in modules:
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:12]


def checkpoint(shape: str, seed: int = 0) -> Path:
    """A synthetic checkpoint of ``shape``; rebuilt only when synth.py changes."""
    out = cache_root() / "checkpoints" / f"synth-{shape}-s{seed}-{_code_key(synth)}"
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        synth.synthesize(shape, tmp, seed=seed)
        tmp.rename(out)
    return out


def artifact(shape: str, params: convert_mod.ConvertParams, seed: int = 0) -> Path:
    """``checkpoint(shape)`` converted with ``params``; rebuilt when the checkpoint or converter changes."""
    src = checkpoint(shape, seed)
    fmt = params.weight_format if params.weight_format != "int4" else f"int4-g{params.group_size}-r{params.ratio}"
    out = cache_root() / "artifacts" / f"{src.name}-{fmt}-{_code_key(convert_mod)}"
    if not out.is_dir():
        convert_mod.convert(src, out, params, quiet=True)
    return out


def tiny_checkpoint() -> Path:
    return checkpoint("tiny")


def tiny_artifact() -> Path:
    # Group size 16: the tiny model's layers are narrower than the default 128.
    return artifact("tiny", convert_mod.ConvertParams("int4", group_size=16))

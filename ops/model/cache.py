"""Cached synthetic checkpoints and artifacts, keyed by the code and parameters that make them."""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

from ops.model import convert as convert_mod
from ops.model import synth
from ops.paths import cache_root, locked
from service.runtime import manifest as manifest_mod


def _code_key(*modules) -> str:
    h = hashlib.sha256()
    for mod in modules:
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:12]


def checkpoint(shape: str, seed: int = 0, quiet: bool = True) -> Path:
    """A synthetic checkpoint of ``shape``; rebuilt only when synth.py changes."""
    out = cache_root() / "checkpoints" / f"synth-{shape}-s{seed}-{_code_key(synth)}"
    if (out / "config.json").is_file():
        return out
    with locked(out):
        if not (out / "config.json").is_file():
            tmp = out.with_name(out.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            started = time.monotonic()
            _say(quiet, f"synthesizing the {shape}-shape checkpoint into {out} (the 2b shape: about a minute, 4 GB)")
            synth.synthesize(shape, tmp, seed=seed)
            tmp.rename(out)
            _say(quiet, f"checkpoint written in {time.monotonic() - started:.0f} s")
    return out


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"[model] {message}", file=sys.stderr, flush=True)


def artifact(shape: str, params: convert_mod.ConvertParams, seed: int = 0, quiet: bool = True) -> Path:
    """``checkpoint(shape)`` converted with ``params`` (with manifest.json); rebuilt when either changes."""
    src = checkpoint(shape, seed, quiet)
    out = cache_root() / "artifacts" / f"{src.name}-{params.label()}-{_code_key(convert_mod, manifest_mod)}"
    if not (out / manifest_mod.MANIFEST_NAME).is_file():
        convert_mod.convert(src, out, params, quiet=quiet)
    return out


def tiny_checkpoint() -> Path:
    return checkpoint("tiny")


def tiny_artifact() -> Path:
    # Group size 16: the tiny model's layers are narrower than the default 128.
    return artifact("tiny", convert_mod.ConvertParams("int4", group_size=16))

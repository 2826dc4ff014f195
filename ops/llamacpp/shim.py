"""libvlfleet_llama.so: the hybrid engine's flat C interface to libllama (ops/llamacpp/vlfleet_llama.c), compiled
against a cached llama.cpp build.

Kept beside the build it links, under ``<build>/shim-<source hash>/``, so a change of the C source builds it again
(in seconds) without building llama.cpp again. Its RPATH is its own directory and the build's bin/, so it loads
the same libllama here and in the wheel, where it sits in bin/ beside the libraries.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from ops.llamacpp import source as source_mod
from ops.llamacpp.build import Build, BuildError

SOURCE = Path(__file__).with_name("vlfleet_llama.c")
NAME = "libvlfleet_llama.so"


def source_key() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def compile_command(tree: Path, build: Build, out: Path) -> list[str]:
    return ["cc", "-O2", "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out), str(SOURCE),
            f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}", f"-L{build.bin_dir}", "-lllama", "-lggml",
            "-lggml-base", f"-Wl,-rpath,$ORIGIN:{build.bin_dir}"]


def shim(build: Build) -> Path:
    """The compiled shim of ``build``, compiled first if absent."""
    out = build.root / f"shim-{source_key()}" / NAME
    if out.is_file():
        return out
    if shutil.which("cc") is None:
        raise BuildError("cc not found on PATH; install it (apt-get install gcc)")
    tree = source_mod.fetch(build.info["version"]).llama_cpp
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{NAME}.tmp")
    done = subprocess.run(compile_command(tree, build, tmp), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise BuildError(f"compiling {SOURCE.name} failed:\n{done.stderr[-2000:]}")
    tmp.replace(out)
    return out

"""A cached build of llama.cpp's llama-server, llama-quantize and llama-mtmd-cli from the verified source.

The build lives in ``$VLFLEET_CACHE/llamacpp/<version>-<key>/`` where the key hashes the cmake flags, the
targets and, for a native build, the CPU model and ISA flags it was tuned for (a native binary run on another CPU
generation may stop on an illegal instruction, so it must not be reused there). ``build.json`` is written last:
a directory without it is an unfinished build and is built again. Parallel builds of one key wait on a lock.
The compiler runs under ``nice`` with a bounded job count and a time limit, and its progress is printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ops.llamacpp import source as source_mod
from ops.paths import cache_root, locked

TARGETS = ("llama-server", "llama-quantize", "llama-mtmd-cli")
COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",  # no downloads from model hubs at run time
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise configure downloads the server's web UI
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
# The bench's peer on the controller: tuned for this CPU.
NATIVE_FLAGS = ("-DGGML_NATIVE=ON",)
# Binaries for hosts of several CPU generations: every CPU variant as a backend library, chosen at run time.
PORTABLE_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON")
DEFAULT_TIMEOUT_S = 3600.0
_PROGRESS = re.compile(r"^\[\s*(\d+)%\]\s*(.*)$")


class BuildError(RuntimeError):
    """cmake or the compiler failed, timed out, or is missing; the message says which and what to do."""


@dataclass(frozen=True)
class BuildConfig:
    version: str = source_mod.VERSION
    native: bool = True
    targets: tuple[str, ...] = TARGETS
    # Only for native builds: the CPU the binaries are tuned for (ops.machine.describe()).
    cpu: dict = field(default_factory=dict, compare=False, hash=False)
    optimize: int = 3  # the compiler's -O level (Release's own is 3)

    def flags(self) -> tuple[str, ...]:
        level = () if self.optimize == 3 else tuple(f"-DCMAKE_{lang}_FLAGS_RELEASE=-O{self.optimize} -DNDEBUG"
                                                     for lang in ("C", "CXX"))
        return COMMON_FLAGS + (NATIVE_FLAGS if self.native else PORTABLE_FLAGS) + level

    def key_material(self) -> dict:
        material = {"version": self.version, "flags": list(self.flags()), "targets": list(self.targets)}
        if self.native:
            material["cpu"] = {"model": self.cpu.get("cpu", ""), "isa": list(self.cpu.get("isa", []))}
        return material

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.key_material(), sort_keys=True).encode()).hexdigest()[:12]

    def dirname(self) -> str:
        return f"{self.version}-{self.key()}"


def test_config() -> BuildConfig:
    """What the test suite runs on the tiny model: llama-server and llama-quantize at -O1, which builds in about half
    the time of the bench's -O3 build under the same load, and is fast enough for a tiny model."""
    return replace(default_config(), targets=("llama-server", "llama-quantize"), optimize=1)


def default_config(native: bool = True, version: str = source_mod.VERSION) -> BuildConfig:
    from ops.machine import describe

    return BuildConfig(version=version, native=native, cpu=describe() if native else {})


def build_dir(config: BuildConfig) -> Path:
    return cache_root() / "llamacpp" / config.dirname()


def configure_command(src: Path, build: Path, config: BuildConfig) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), *config.flags()]


def build_command(build: Path, config: BuildConfig, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *config.targets]


def niced(cmd: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *cmd] if nice else cmd


@dataclass(frozen=True)
class Build:
    """A finished build: where its binaries are and how it was made."""

    root: Path
    info: dict

    @property
    def bin_dir(self) -> Path:
        return self.root / "build" / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def find(config: BuildConfig) -> Build | None:
    """The finished build of ``config`` in the cache, or None (nothing is built)."""
    root = build_dir(config)
    info_file = root / "build.json"
    if not info_file.is_file():
        return None
    found = Build(root, json.loads(info_file.read_text()))
    if not all(found.binary(t).is_file() for t in config.targets):
        return None
    return found


def check_tools() -> None:
    missing = [tool for tool in ("cmake", "c++", "make") if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"{', '.join(missing)} not found on PATH; install them (apt-get install cmake g++ make)")


def build(config: BuildConfig | None = None, jobs: int = 2, nice: int = 19, timeout: float = DEFAULT_TIMEOUT_S,
          say: Callable[[str], None] | None = None) -> Build:
    """The cached build of ``config`` (default: native for this CPU), built first if absent."""
    config = config or default_config()
    say = say or _printer()
    done = find(config)
    if done is not None:
        say(f"llama.cpp {config.version} already built in {done.root}")
        return done
    check_tools()
    src = source_mod.fetch(config.version)
    root = build_dir(config)
    with locked(root):
        done = find(config)
        if done is not None:
            return done
        root.mkdir(parents=True, exist_ok=True)
        (root / "build.json").unlink(missing_ok=True)
        log = root / "build.log"
        started = time.monotonic()
        deadline = started + timeout
        say(f"configuring llama.cpp {config.version} ({'native' if config.native else 'portable'}) in {root}; "
            f"log: {log}")
        with open(log, "w") as out:
            _run(niced(configure_command(src.llama_cpp, root / "build", config), nice), out, deadline, say, log)
            say(f"compiling {', '.join(config.targets)} with -j{jobs} under nice {nice}; this takes 6-15 min "
                f"on 2 cores (limit {timeout / 60:.0f} min)")
            _run(niced(build_command(root / "build", config, jobs), nice), out, deadline, say, log)
        elapsed = time.monotonic() - started
        info = {"version": config.version, "sdist_sha256": src.sha256, **config.key_material(),
                "jobs": jobs, "build_s": round(elapsed, 1), "compiler": _compiler_version(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "binaries": {t: str(root / "build" / "bin" / t) for t in config.targets}}
        (root / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        say(f"built in {elapsed / 60:.1f} min: {root / 'build' / 'bin'}")
    result = find(config)
    if result is None:
        raise BuildError(f"the build finished but {', '.join(config.targets)} are not all in {root}/build/bin")
    return result


def _compiler_version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    return ""


def _printer() -> Callable[[str], None]:
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[llamacpp.build {time.monotonic() - started:5.0f}s] {message}", flush=True)

    return say


def _run(cmd: list[str], out, deadline: float, say: Callable[[str], None], log: Path) -> None:
    """Run ``cmd`` writing its output to ``out``; print its progress lines (at most one per 5 %); stop it (its
    process group, which we started) at ``deadline``."""
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    shown = -5
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            m = _PROGRESS.match(line.strip())
            if m and int(m.group(1)) >= shown + 5:
                shown = int(m.group(1))
                say(f"[{shown:3d}%] {m.group(2)[:100]}")
            if time.monotonic() > deadline:
                raise BuildError(f"the llama.cpp build did not finish in time; stopped it (log: {log}). Raise "
                                 "--timeout on a slow or busy machine")
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise BuildError(f"the llama.cpp build did not finish in time; stopped it (log: {log})") from None
    except BaseException:
        _stop(proc)
        raise
    if proc.returncode != 0:
        out.flush()
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        step = "cmake --build" if "--build" in cmd else "cmake configure"
        raise BuildError(f"{step} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the group of the process we started: cmake, make and the compilers
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:  # python -m ops.llamacpp.build (for scripts; vlfleet llamacpp.build)
    b = build()
    print(b.bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A cached build of llama.cpp's llama-server, llama-quantize and llama-mtmd-cli from the verified source.

The build lives in ``$VLFLEET_CACHE/llamacpp/<version>-<key>/`` where the key hashes the cmake flags, the
targets, the CPU variants left out and, for a native build, the CPU model and ISA flags it was tuned for (a native
binary run on another CPU generation may stop on an illegal instruction, so it must not be reused there).
``build.json`` is written last: a directory without it is an unfinished build and is built again. Parallel builds
of one key wait on a lock. The compiler runs under ``nice`` with a bounded job count and a time limit, and its
progress is printed.

No build uses ggml's AMX kernels: on a Xeon with AMX (amx_tile/amx_int8) the bench's native build (-O3) dies with
SIGSEGV in ``ggml_backend_amx_mul_mat`` while llama-server loads the 2b-shape Q4_0 model (issue 30; later SIGILL, on
the tiny and "kernels" GGUFs too, while the -O1 test build of the same flags loaded and answered all three on that
machine: the crash is not a property of the flags alone, so no build is trusted with them). ``-march=native`` turns
them on there, so a native build for such a CPU is ``GGML_NATIVE=OFF`` with the CPU's own ISA options instead (AVX2,
FMA, F16C, AVX-512 with VBMI/VNNI/BF16, AVX-VNNI: whatever it has), AMX off; the repacked Q4_0 kernels (CPU_REPACK,
``q4_0_8x8``) stay, which ``--no-repack`` would lose with the AMX ones. A CPU without AMX keeps ``GGML_NATIVE=ON``.
A portable build compiles every x86 variant ggml lists, among them one with AMX (``sapphirerapids``) that its loader
would pick on such a host (ggml-cpu/arch/x86/cpu-feats.cpp scores AMX_INT8 highest); that variant's library is
removed after the build (EXCLUDED_FEATURES), so an AMX host loads the best variant without it (``zen4``: AVX-512
VBMI/VNNI/BF16).
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
# The bench's peer on the controller: tuned for this CPU (on a CPU with AMX: native_flags).
NATIVE_FLAGS = ("-DGGML_NATIVE=ON",)
# Binaries for hosts of several CPU generations: every CPU variant as a backend library, chosen at run time.
PORTABLE_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON")
# /proc/cpuinfo flags of the ggml kernels no build uses (see the module doc): AMX.
AMX_CPU_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
# ggml's x86 ISA options (ggml/src/ggml-cpu/CMakeLists.txt, without GGML_NATIVE) and the cpuinfo flags of the
# compiler flags each one adds: a native build for an AMX CPU turns on those its CPU has.
GGML_ISA_OPTIONS = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# The features (ggml's names) of the CPU variants a portable build must not ship: their libraries are removed.
EXCLUDED_FEATURES = ("AMX_TILE", "AMX_INT8", "AMX_BF16")
DEFAULT_TIMEOUT_S = 3600.0
_PROGRESS = re.compile(r"^\[\s*(\d+)%\]\s*(.*)$")


class BuildError(RuntimeError):
    """cmake or the compiler failed, timed out, or is missing; the message says which and what to do."""


def native_flags(flags) -> tuple[str, ...]:
    """The cmake flags that tune a build for a CPU with these /proc/cpuinfo ``flags``: ``GGML_NATIVE=ON``, or on a
    CPU with AMX ``GGML_NATIVE=OFF`` with each of GGML_ISA_OPTIONS on where the CPU has its flags and AMX off (the
    module doc says why)."""
    have = set(flags)
    if not have & set(AMX_CPU_FLAGS):
        return NATIVE_FLAGS
    isa = tuple(f"-D{option}={'ON' if set(needs) <= have else 'OFF'}" for option, needs in GGML_ISA_OPTIONS)
    return ("-DGGML_NATIVE=OFF", *isa, *(f"-D{option}=OFF" for option in AMX_OPTIONS))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Every flag of this CPU (the first ``flags`` line of /proc/cpuinfo), sorted; what native_flags reads."""
    from ops.machine import cpuinfo_field

    text = cpuinfo.read_text() if cpuinfo.is_file() else ""
    return sorted(set(cpuinfo_field(text, "flags").split()))


@dataclass(frozen=True)
class BuildConfig:
    version: str = source_mod.VERSION
    native: bool = True
    targets: tuple[str, ...] = TARGETS
    # Only for native builds: the CPU the binaries are tuned for (ops.machine.describe(), and ``flags``: every
    # /proc/cpuinfo flag, cpu_flags(); without it the ISA_FLAGS in ``isa``).
    cpu: dict = field(default_factory=dict, compare=False, hash=False)
    optimize: int = 3  # the compiler's -O level (Release's own is 3)

    def flags(self) -> tuple[str, ...]:
        level = () if self.optimize == 3 else tuple(f"-DCMAKE_{lang}_FLAGS_RELEASE=-O{self.optimize} -DNDEBUG"
                                                     for lang in ("C", "CXX"))
        if not self.native:
            return COMMON_FLAGS + PORTABLE_FLAGS + level
        return COMMON_FLAGS + native_flags(self.cpu.get("flags") or self.cpu.get("isa", [])) + level

    @property
    def excluded_features(self) -> tuple[str, ...]:
        """The ggml features whose CPU variants a portable build removes (none for a native build, which has one
        CPU backend, built without them: native_flags)."""
        return () if self.native else EXCLUDED_FEATURES

    def key_material(self) -> dict:
        material = {"version": self.version, "patches": source_mod.patches_key(), "flags": list(self.flags()),
                    "targets": list(self.targets)}
        if self.excluded_features:
            material["excluded_cpu_features"] = list(self.excluded_features)
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

    return BuildConfig(version=version, native=native, cpu={**describe(), "flags": cpu_flags()} if native else {})


def build_dir(config: BuildConfig) -> Path:
    return cache_root() / "llamacpp" / config.dirname()


def configure_command(src: Path, build: Path, config: BuildConfig) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), *config.flags()]


def build_command(build: Path, config: BuildConfig, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *config.targets]


_VARIANT = re.compile(r"^\s*ggml_add_cpu_backend_variant\(\s*([\w.]+)([^)]*)\)", re.MULTILINE)


def cpu_variants(ggml_cmake: str) -> dict[str, tuple[str, ...]]:
    """The CPU variants a portable build compiles, with their features, as ggml/src/CMakeLists.txt lists them
    (``ggml_add_cpu_backend_variant(sapphirerapids SSE42 ... AMX_TILE AMX_INT8)``); every architecture's."""
    return {m.group(1): tuple(m.group(2).split()) for m in _VARIANT.finditer(ggml_cmake)}


def excluded_variants(ggml_cmake: str, features: tuple[str, ...]) -> list[str]:
    """The variants of ``ggml_cmake`` that have any of ``features``."""
    return sorted(name for name, have in cpu_variants(ggml_cmake).items() if set(have) & set(features))


def remove_variants(llama_cpp: Path, bin_dir: Path, features: tuple[str, ...]) -> list[str]:
    """Remove from ``bin_dir`` the CPU backend libraries of the variants with any of ``features`` (ggml's loader
    then picks the best of the others); the variants' names. Raises BuildError when ggml lists no variants at all
    (a source layout this code does not know: better no build than one that may crash)."""
    if not features:
        return []
    cmake = (Path(llama_cpp) / "ggml" / "src" / "CMakeLists.txt").read_text()
    if not cpu_variants(cmake):
        raise BuildError(f"found no ggml_add_cpu_backend_variant(...) in {llama_cpp}/ggml/src/CMakeLists.txt: cannot "
                         f"tell which CPU variants use {', '.join(features)}; update ops/llamacpp/build.py")
    names = excluded_variants(cmake, features)
    for name in names:
        for lib in Path(bin_dir).glob(f"libggml-cpu-{name}.so*"):
            lib.unlink()
    return names


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
    missing = [tool for tool in ("cmake", "c++", "make", "patch") if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"{', '.join(missing)} not found on PATH; install them (apt-get install cmake g++ make patch)")


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
        removed = remove_variants(src.llama_cpp, root / "build" / "bin", config.excluded_features)
        if removed:
            say(f"removed the CPU variants with {', '.join(config.excluded_features)}: {', '.join(removed)}")
        elapsed = time.monotonic() - started
        info = {"version": config.version, "sdist_sha256": src.sha256, "native": config.native,
                **config.key_material(),
                "removed_cpu_variants": removed, "jobs": jobs, "build_s": round(elapsed, 1),
                "compiler": _compiler_version(),
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

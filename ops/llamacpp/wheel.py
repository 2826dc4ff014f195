"""A cached llama-server build as a wheel, so hosts get it from their offline wheelhouse like any other runtime part.

The wheel ``vlfleet_llama_server-<version>+<build key>-py3-none-linux_x86_64.whl`` holds the package
``vlfleet_llama_server``: ``bin/`` with llama-server, the hybrid engine's libvlfleet_llama.so, and exactly the
build's shared libraries they load (their DT_NEEDED closure, each under its soname, plus a portable build's
dlopened ``libggml-cpu*`` backends), and ``build.json`` saying what it was built for. It is written with zipfile
alone, with fixed timestamps, so one build always gives the same bytes (and the same hash in the wheelhouse's
requirements.txt). Cached under ``$VLFLEET_CACHE/llamacpp-wheels/``, keyed by this module's code, the shim's source
and the build's key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ops.llamacpp import shim as shim_mod
from ops.llamacpp.build import Build
from ops.paths import cache_root

DIST = "vlfleet_llama_server"
TAG = "py3-none-linux_x86_64"
SERVER = "llama-server"
_DATE = (1980, 1, 1, 0, 0, 0)  # zip's epoch: the same build gives the same bytes
_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]")

# The package's __init__.py: a file of its own, never imported here (it reads the wheel's build.json)
INIT_PY = Path(__file__).with_name("wheel_init.py")


class WheelError(RuntimeError):
    """The wheel cannot be made from this build; the message says why."""


def build_key(build: Build) -> str:
    return build.root.name.removeprefix(f"{build.info['version']}-")


def _version(build: Build) -> str:
    return f"{build.info['version']}+{build_key(build)}"  # a local version: the key tells builds apart


def _dist_info(build: Build) -> str:
    return f"{DIST}-{_version(build)}.dist-info"


def wheel_name(build: Build) -> str:
    return f"{DIST}-{_version(build)}-{TAG}.whl"


def is_native(info: dict) -> bool:
    """Whether build.json ``info`` is a native build (one CPU backend, for the CPU in ``cpu``): its own word, else
    (builds from before it said) the absence of the portable flag; not GGML_NATIVE, which a native build for a CPU
    with AMX turns off (ops.llamacpp.build.native_flags)."""
    if "native" in info:
        return bool(info["native"])
    return "-DGGML_CPU_ALL_VARIANTS=ON" not in info.get("flags", [])


def build_json(build: Build) -> dict:
    """What the package says about its binaries; ``requires_isa``: the CPU flags a native build was tuned for
    (the service refuses to start it on a CPU without them), none for a portable build."""
    native = is_native(build.info)
    cpu = build.info.get("cpu", {})
    return {"version": build.info["version"], "key": build_key(build), "native": native,
            "cpu": cpu.get("model", "") if native else "", "requires_isa": list(cpu.get("isa", [])) if native else []}


def needed(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file (readelf -d)."""
    try:
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True, timeout=60)
    except FileNotFoundError:
        raise WheelError("readelf not found on PATH; install binutils (apt-get install binutils)") from None
    except subprocess.SubprocessError as e:
        raise WheelError(f"readelf -d {path} failed: {e}") from None
    return _NEEDED.findall(out.stdout)


# Libraries every glibc Linux host has (the manylinux policy's list, as auditwheel applies it): never bundled.
# Any other library the binaries need and the build dir lacks (OpenMP's libgomp) is bundled from this machine.
SYSTEM_LIBS = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
                         "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2", "libresolv.so.2"})


def system_library(name: str) -> Path:
    """Where this machine's dynamic loader finds ``name`` (ldconfig -p)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise WheelError(f"ldconfig -p failed ({e}); it is needed to find {name}") from None
    for line in out.splitlines():
        lib, _, path = line.strip().partition(" => ")
        if lib.split(" ", 1)[0] == name and "x86-64" in lib:
            return Path(path)
    raise WheelError(f"the build needs {name}, which this machine's dynamic loader does not find")


def binaries(build: Build) -> dict[str, Path]:
    """bin/'s files by the name they get in the wheel: llama-server, a portable build's CPU backends (dlopened from
    the executable's directory), and their NEEDED closure: the build's libraries, and system libraries a host may
    lack; never the ones every host has (SYSTEM_LIBS)."""
    bin_dir = build.bin_dir
    server = bin_dir / SERVER
    if not server.is_file():
        raise WheelError(f"{server} is missing: build again with `vlfleet llamacpp.build`")
    files = {SERVER: server, shim_mod.NAME: shim_of(build)}  # the hybrid engine's interface to libllama
    if not build_json(build)["native"]:
        files.update({p.name: p for p in sorted(bin_dir.glob("libggml-cpu*.so*")) if p.is_file()})
    todo = list(files.values())
    while todo:
        for name in needed(todo.pop()):
            if name in files or name in SYSTEM_LIBS:
                continue
            files[name] = bin_dir / name if (bin_dir / name).is_file() else system_library(name)
            todo.append(files[name])
    return files


def shim_of(build: Build) -> Path:
    return shim_mod.shim(build)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _metadata(version: str) -> str:
    return (f"Metadata-Version: 2.1\nName: {DIST.replace('_', '-')}\nVersion: {version}\n"
            "Summary: llama.cpp's llama-server built by vlfleet, with its shared libraries\nRequires-Python: >=3.10\n")


def _entries(build: Build) -> list[tuple[str, bytes, int]]:
    """(path in the wheel, content, unix mode) of every file but RECORD."""
    info = _dist_info(build)
    entries = [(f"{DIST}/__init__.py", INIT_PY.read_bytes(), 0o644),
               (f"{DIST}/build.json", (json.dumps(build_json(build), indent=2) + "\n").encode(), 0o644)]
    entries += [(f"{DIST}/bin/{name}", path.read_bytes(), 0o755) for name, path in sorted(binaries(build).items())]
    wheel = f"Wheel-Version: 1.0\nGenerator: vlfleet\nRoot-Is-Purelib: false\nTag: {TAG}\n"
    return [*entries, (f"{info}/METADATA", _metadata(_version(build)).encode(), 0o644),
            (f"{info}/WHEEL", wheel.encode(), 0o644)]


def _write(path: Path, entries: list[tuple[str, bytes, int]], record_name: str) -> None:
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data, _ in entries)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in [*entries, (record_name, (record + f"{record_name},,\n").encode(), 0o644)]:
            zinfo = zipfile.ZipInfo(name, date_time=_DATE)
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            zinfo.external_attr = (0o100000 | mode) << 16  # a regular file; pip keeps the x bits
            zf.writestr(zinfo, data)


def runtime_wheel(build: Build, out_dir: Path | None = None) -> Path:
    """The wheel of ``build`` (made once per build key, then reused); copied into ``out_dir`` when given."""
    # keyed by this module's code too: a change in what goes into the wheel must not reuse an older wheel
    code = hashlib.sha256(Path(__file__).read_bytes() + shim_mod.SOURCE.read_bytes()).hexdigest()[:12]
    cached = cache_root() / "llamacpp-wheels" / code / wheel_name(build)
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cached.name}.", dir=cached.parent)
        os.close(fd)
        try:
            _write(Path(tmp), _entries(build), f"{_dist_info(build)}/RECORD")
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would follow the wheel into wheelhouses
            os.replace(tmp, cached)  # readers never see half a wheel
        finally:
            Path(tmp).unlink(missing_ok=True)
    if out_dir is None:
        return cached
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(cached, Path(out_dir) / cached.name))


BUILD_KINDS = ("portable", "native")


def hosts_wheel(kind: str = "portable", out_dir: Path | None = None) -> Path:
    """The runtime wheel for a fleet's wheelhouse, built or reused: ``portable`` (every CPU variant as a backend,
    picked at run time: hosts of any x86-64 generation) or ``native`` (tuned for this controller's CPU); copied
    into ``out_dir`` when given."""
    from ops.llamacpp import build

    if kind not in BUILD_KINDS:
        raise WheelError(f"llama.cpp build {kind!r}: use portable (hosts of any x86-64 CPU) or native (hosts with "
                         "this controller's CPU)")
    return runtime_wheel(build.build(build.default_config(native=kind == "native")), out_dir)

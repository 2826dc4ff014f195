"""llama.cpp's source: the PyPI sdist of llama-cpp-python, which vendors a complete llama.cpp tree.

Fetched with pip (the ordinary PyPI client) into ``$VLFLEET_CACHE/llamacpp/src/``, checked against the sha256
pinned here, unpacked once and patched with ``patches/*.patch`` (in name order, ``patch -p1`` in the llama.cpp
tree): the unpacked directory's name ends in the patches' hash, so changing a patch unpacks and builds again. The
tree is what ``build.py`` compiles and what ``gguf.py``'s converter runs from.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ops.paths import cache_root, locked
from service.runtime.manifest import sha256_file as sha256_of

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI serves it; a different file is refused.
SDIST_SHA256 = {"0.3.36": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"}
# What the rest of ops.llamacpp needs from the vendored tree.
REQUIRED = ("CMakeLists.txt", "convert_hf_to_gguf.py", "conversion/base.py", "gguf-py/gguf/__init__.py",
            "tools/server", "tools/mtmd", "tools/quantize")
PATCHES = Path(__file__).with_name("patches")


class SourceError(RuntimeError):
    """The sdist could not be fetched, did not match its pinned sha256, or lacks part of llama.cpp."""


@dataclass(frozen=True)
class Source:
    version: str
    sdist: Path  # the .tar.gz as downloaded
    root: Path  # the unpacked sdist
    sha256: str

    @property
    def llama_cpp(self) -> Path:
        """The vendored llama.cpp tree (CMakeLists.txt, convert_hf_to_gguf.py, gguf-py, tools/)."""
        return self.root / "vendor" / "llama.cpp"


def sdist_name(version: str) -> str:
    return f"llama_cpp_python-{version}.tar.gz"


def patches() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def patches_key() -> str:
    """A hash of the patches' names and contents: part of the unpacked tree's name and of every build's key."""
    digest = hashlib.sha256()
    for path in patches():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def src_dir() -> Path:
    return cache_root() / "llamacpp" / "src"


def download_command(version: str, dest: Path) -> list[str]:
    """pip download of the sdist alone: no dependencies, never a wheel (a wheel has no llama.cpp sources)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
            f"{PACKAGE}=={version}", "-d", str(dest)]


def check_sdist(path: Path, version: str) -> str:
    """The sdist's sha256 when it is the pinned one; SourceError naming both hashes otherwise."""
    want = SDIST_SHA256.get(version)
    if want is None:
        raise SourceError(f"no sha256 is pinned for {PACKAGE} {version}; add it to SDIST_SHA256 in "
                          f"ops/llamacpp/source.py (known: {', '.join(SDIST_SHA256)})")
    got = sha256_of(path)
    if got != want:
        raise SourceError(f"{path.name} has sha256 {got}, the pinned one is {want}; delete {path} and fetch again")
    return got


def missing_parts(tree: Path) -> list[str]:
    return [rel for rel in REQUIRED if not (tree / rel).exists()]


def fetch(version: str = VERSION, quiet: bool = False) -> Source:
    """The unpacked, verified sdist of ``version`` (downloaded and unpacked on first use; cached)."""
    base = src_dir()
    root = base / f"llama_cpp_python-{version}-{patches_key()}"
    sdist = base / sdist_name(version)
    marker = root / ".vlfleet-verified"
    if not marker.is_file():
        with locked(root):
            if not marker.is_file():
                _fetch_into(base, root, sdist, version, quiet)
    sha = marker.read_text().strip()
    source = Source(version, sdist, root, sha)
    missing = missing_parts(source.llama_cpp)
    if missing:
        raise SourceError(f"{source.llama_cpp} lacks {', '.join(missing)}; delete {root} and fetch again")
    return source


def _fetch_into(base: Path, root: Path, sdist: Path, version: str, quiet: bool) -> None:
    if sdist.is_file():
        try:
            check_sdist(sdist, version)
        except SourceError:
            sdist.unlink()  # a partial or foreign download: fetch it again
    if not sdist.is_file():
        if not quiet:
            print(f"[llamacpp] downloading the {PACKAGE} {version} sdist with pip into {base}", flush=True)
        done = subprocess.run(download_command(version, base), capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not sdist.is_file():
            raise SourceError(f"pip download of {PACKAGE}=={version} failed (exit {done.returncode}): "
                              f"{(done.stderr or done.stdout).strip()[-500:]}")
    sha = check_sdist(sdist, version)
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")  # no absolute paths, links out of the tree or device files
    (unpacked,) = list(tmp.iterdir())
    missing = missing_parts(unpacked / "vendor" / "llama.cpp")
    if missing:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(f"the {PACKAGE} {version} sdist lacks vendor/llama.cpp/{', '.join(missing)}")
    _apply_patches(unpacked / "vendor" / "llama.cpp", tmp)
    (unpacked / ".vlfleet-verified").write_text(sha + "\n")
    unpacked.rename(root)
    shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"[llamacpp] {sdist.name} (sha256 {sha[:12]}...) unpacked into {root}", flush=True)


def _apply_patches(tree: Path, tmp: Path) -> None:
    for path in patches():
        done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(path)], cwd=tree,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            said = " ".join((done.stdout + done.stderr).split())[-500:]
            raise SourceError(f"{path.name} does not apply to llama.cpp's tree: {said}; a new VERSION needs its "
                              f"patches rebased or removed ({PATCHES})")

"""The host runtime as a wheelhouse: every wheel a serving host needs, for its Python, with a hash-pinned
requirements file, so hosts install air-gapped:

    pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt

The pins are read from pyproject.toml's ``host`` extra (the single place pins live); ``pip download`` resolves
their dependencies for the target interpreter and platform, and the project's own wheel is built from the
working tree. Two cache levels under the vlfleet cache: third-party wheels by (python, platform, pins), the
finished wheelhouse additionally by (project version, code hash).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ops.paths import cache_root, locked, repo_root
from service.runtime.manifest import sha256_file

PYTHONS = ("3.10", "3.11", "3.12")
# Ubuntu 22.04 ships glibc 2.35: its hosts take any manylinux_2_x wheel with x <= 35.
DEFAULT_PLATFORM = "manylinux_2_35_x86_64"
_LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
# What goes into the project's wheel (pyproject: packages ops*, service*).
_PROJECT_TREES = ("ops", "service")
_PROJECT_FILES = ("pyproject.toml", "README.md")


class WheelhouseError(RuntimeError):
    """A wheelhouse cannot be built; the message says why and what to change."""


@dataclass(frozen=True)
class Target:
    python: str  # "3.10"
    platform: str  # "manylinux_2_35_x86_64"

    def __post_init__(self) -> None:
        if self.python not in PYTHONS:
            raise WheelhouseError(f"--python must be one of {', '.join(PYTHONS)}, got {self.python!r}")
        platform_tags(self.platform)  # validates

    @property
    def label(self) -> str:
        return f"py{self.python}-{self.platform}"


def platform_tags(platform: str) -> list[str]:
    """Every manylinux tag a host of ``platform`` accepts, newest first (pip does not expand them itself).

    ``manylinux_2_35_x86_64`` -> manylinux_2_35 ... manylinux_2_5 plus the legacy aliases; the legacy names
    (``manylinux2014_x86_64``) mean their glibc (2.17). Other platform strings are passed through as they are.
    """
    m = (re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
         or re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform))
    if not m:
        if not re.fullmatch(r"[a-z0-9_]+", platform):
            raise WheelhouseError(f"--platform {platform!r} is not a wheel platform tag such as {DEFAULT_PLATFORM}")
        return [platform]
    glibc = int(m.group(1)) if m.group(1).isdigit() else _LEGACY[m.group(1)]
    arch = m.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    tags += [f"{name}_{arch}" for name, minor in _LEGACY.items() if minor <= glibc]
    return tags


def read_pyproject(pyproject: Path | None = None) -> dict:
    """pyproject.toml as a dict: tomllib on 3.11+, else the two keys this module needs (project code is 3.10)."""
    text = (pyproject or repo_root() / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:
        return _read_pyproject_310(text)
    return tomllib.loads(text)


def _read_pyproject_310(text: str) -> dict:
    # Just project.version and the optional-dependencies arrays of strings, as this file writes them.
    sections: dict[str, dict] = {}
    current: dict = {}
    array: list[str] | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.strip().startswith('"') else raw.strip()
        if array is not None:
            if line.startswith("]"):
                array = None
            else:
                array += re.findall(r'"([^"]*)"', line)
            continue
        if m := re.fullmatch(r"\[([^\]]+)\]", line):
            current = sections.setdefault(m.group(1), {})
        elif m := re.fullmatch(r'([\w-]+)\s*=\s*"([^"]*)"', line):
            current[m.group(1)] = m.group(2)
        elif m := re.fullmatch(r"([\w-]+)\s*=\s*\[(.*)", line):
            current[m.group(1)] = array = re.findall(r'"([^"]*)"', m.group(2))
            if "]" in m.group(2):
                array = None
    project = sections.get("project", {})
    return {"project": {**project, "optional-dependencies": sections.get("project.optional-dependencies", {})}}


def host_pins(pyproject: Path | None = None) -> list[str]:
    """The ``host`` extra of pyproject.toml: exact ``name==version`` pins."""
    pyproject = pyproject or repo_root() / "pyproject.toml"
    pins = read_pyproject(pyproject)["project"]["optional-dependencies"]["host"]
    loose = [p for p in pins if "==" not in p]
    if loose:
        raise WheelhouseError(f"host pins in {pyproject} must be exact (name==version): {', '.join(loose)}")
    return list(pins)


def project_version(pyproject: Path | None = None) -> str:
    return read_pyproject(pyproject)["project"]["version"]


def _project_files(root: Path) -> list[Path]:
    files = [root / name for name in _PROJECT_FILES if (root / name).is_file()]
    for tree in _PROJECT_TREES:
        files += [p for p in sorted((root / tree).rglob("*"))
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return files


def code_hash(root: Path | None = None) -> str:
    root = root or repo_root()
    h = hashlib.sha256()
    for path in _project_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _pip(*args: str, quiet: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args]
    return subprocess.run(cmd, text=True, capture_output=quiet)


def download_deps(target: Target, pins: list[str], quiet: bool = False) -> Path:
    """Third-party wheels for ``target`` (pins and their dependencies), cached by (target, pins)."""
    out = cache_root() / "wheelhouse" / "deps" / f"{target.label}-{_key(*pins)}"
    if (out / ".complete").is_file():
        return out
    with locked(out):
        if not (out / ".complete").is_file():
            _download_deps(target, pins, out, quiet)
    return out


def _download_deps(target: Target, pins: list[str], out: Path, quiet: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        args = ["download", "--only-binary=:all:", "--python-version", target.python, "--implementation", "cp",
                "--dest", str(tmp), "--progress-bar", "off" if quiet else "on"]
        for tag in platform_tags(target.platform):
            args += ["--platform", tag]
        res = _pip(*args, *pins, quiet=quiet)
        if res.returncode != 0:
            detail = (res.stderr or "").strip().splitlines()[-2:] if quiet else ["(pip's output is above)"]
            raise WheelhouseError(
                f"pip could not download wheels of {' '.join(pins)} for Python {target.python} on {target.platform}: "
                f"{' '.join(detail)}. Every host pin needs a binary wheel for that target; openvino needs "
                f"manylinux_2_28 or newer (Ubuntu 22.04 is {DEFAULT_PLATFORM})")
        (tmp / ".complete").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_project_wheel(dest: Path, root: Path | None = None) -> Path:
    """The project's own wheel, built from a copy of the working tree (keeps build/ out of the checkout)."""
    root = root or repo_root()
    with tempfile.TemporaryDirectory(prefix="vlfleet-wheel-") as tmpdir:
        src = Path(tmpdir) / "src"
        for path in _project_files(root):
            target = src / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        if not (src / "README.md").exists():  # pyproject names it; a checkout in progress may lack it
            (src / "README.md").write_text("vlfleet\n")
        env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}  # reproducible zip timestamps
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir",
               str(dest), str(src)]
        res = subprocess.run(cmd, text=True, capture_output=True, env=env)
        if res.returncode != 0:
            raise WheelhouseError(f"building the project's wheel failed: {res.stderr.strip()[-2000:]}")
    wheels = sorted(dest.glob("vlfleet-*.whl"))
    if len(wheels) != 1:
        raise WheelhouseError(f"expected one vlfleet wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def _requirement(wheel: Path) -> str:
    name, version = wheel.name.split("-")[:2]
    return f"{name.replace('_', '-').lower()}=={version}"


def cache_key(target: Target, pins: Sequence[str], extra_wheels: Sequence[Path] = ()) -> str:
    """What a finished wheelhouse depends on: target, pins, the project's code, and each extra wheel's name and
    content (a wheelhouse with the llama-server wheel is another entry than one without)."""
    extras = [f"{Path(w).name}:{sha256_file(Path(w))}" for w in extra_wheels]
    return _key(target.label, *pins, project_version(), code_hash(), *extras)


def assemble(target: Target, out: Path | None = None, quiet: bool = False,
             extra_wheels: Sequence[Path] = ()) -> Path:
    """The complete wheelhouse for ``target`` (cached), with ``extra_wheels`` added; copied to ``out`` when given."""
    pins = host_pins()
    key = cache_key(target, pins, extra_wheels)
    cached = cache_root() / "wheelhouse" / f"{target.label}-{key}"
    if not (cached / "wheelhouse.json").is_file():
        with locked(cached):
            if not (cached / "wheelhouse.json").is_file():
                _assemble(target, pins, cached, key, quiet, [Path(w) for w in extra_wheels])
    if out is None:
        return cached
    out = Path(out)
    if (out / "wheelhouse.json").is_file() and json.loads((out / "wheelhouse.json").read_text()).get("key") == key:
        return out
    if out.exists() and any(out.iterdir()):
        raise WheelhouseError(f"{out} is not empty and holds another wheelhouse; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cached, out, dirs_exist_ok=True)
    return out


def _assemble(target: Target, pins: list[str], cached: Path, key: str, quiet: bool, extras: list[Path]) -> None:
    deps = download_deps(target, pins, quiet=quiet)
    tmp = cached.with_name(f".{cached.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for wheel in [*sorted(deps.glob("*.whl")), *extras]:
            try:
                os.link(wheel, tmp / wheel.name)  # same disk: no second copy of 90 MB
            except OSError:
                shutil.copy2(wheel, tmp / wheel.name)
        build_project_wheel(tmp)
        write_index(tmp, target, key)
        tmp.rename(cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_index(directory: Path, target: Target, key: str) -> dict:
    """requirements.txt (every wheel, ==version and --hash) and wheelhouse.json (what is in it)."""
    wheels = sorted(directory.glob("*.whl"))
    files = {w.name: {"size": w.stat().st_size, "sha256": sha256_file(w)} for w in wheels}
    lines = [f"# Host runtime for Python {target.python} on {target.platform}. Install with:",
             "#   pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt"]
    lines += [f"{_requirement(w)} --hash=sha256:{files[w.name]['sha256']}" for w in wheels]
    (directory / "requirements.txt").write_text("\n".join(lines) + "\n")
    index = {
        "python": target.python,
        "platform": target.platform,
        "key": key,
        "project_version": project_version(),
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "total_size": sum(f["size"] for f in files.values()),
        "files": files,
    }
    (directory / "wheelhouse.json").write_text(json.dumps(index, indent=2) + "\n")
    return index

"""``manifest.json`` of a model artifact: what it holds, how it was made, and the checks made against it.

Host side and stdlib only: it runs on the hosts' Python 3.10 before anything else in the artifact is trusted.
The controller writes the manifest after a convert (``ops.model.convert``); hosts check it twice:

- ``check_startup(dir, runtime_version)`` (cheap: manifest, file presence and sizes, runtime version) when the
  service starts, raising ``ArtifactError`` that names the failed check and the fix;
- ``verify(dir, full=True)`` (sha256 of every file) from the checklist and the model_artifact role, also as
  ``python -m service.runtime.manifest verify DIR [--full]``, which prints a JSON report and exits 1 on problems.

The artifact id is derived from the files' names, sizes and sha256 only, so the same content always has the
same id wherever and whenever it was built, and any change of content changes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
GGUF_FORMAT = "gguf"  # weight_format.format of a GGUF artifact (llama.cpp), beside OpenVINO IR's int4/int8/fp16
GGUF_PARTS = ("language_model", "mmproj")  # the files a GGUF artifact's weight_format names
_CHUNK = 1 << 20
_FIX_REBUILD = ("copy the artifact again from the controller (the model_artifact role does it), "
                "or rebuild it with `vlfleet model.build`")


class ArtifactError(RuntimeError):
    """A model artifact failed a check. ``check`` names it; the message says what is wrong and how to fix it."""

    def __init__(self, check: str, directory: Path | str, problem: str, fix: str) -> None:
        self.check, self.directory, self.problem, self.fix = check, str(directory), problem, fix
        super().__init__(f"model artifact check '{check}' failed for {directory}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def list_files(directory: Path) -> list[str]:
    """Relative POSIX paths of every file under ``directory`` except the manifest itself, sorted."""
    directory = Path(directory)
    names = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in files:
            rel = (Path(root) / name).relative_to(directory).as_posix()
            if rel != MANIFEST_NAME:
                names.append(rel)
    return sorted(names)


def scan(directory: Path) -> dict[str, FileEntry]:
    """Size and sha256 of every file in the artifact (reads all of it)."""
    directory = Path(directory)
    return {name: FileEntry((directory / name).stat().st_size, sha256_file(directory / name))
            for name in list_files(directory)}


def content_digest(files: Mapping[str, FileEntry]) -> str:
    """sha256 over the sorted (name, size, sha256) table: the identity of the artifact's content."""
    h = hashlib.sha256()
    for name in sorted(files):
        entry = files[name]
        h.update(f"{name}\0{entry.size}\0{entry.sha256}\n".encode())
    return h.hexdigest()


def artifact_id(files: Mapping[str, FileEntry]) -> str:
    # 64 bits: short enough for directory names (/opt/vlfleet/models/<id>), far from colliding in one fleet.
    return content_digest(files)[:16]


def build_manifest(directory: Path, *, source: Mapping[str, Any], weight_format: Mapping[str, Any],
                   tools: Mapping[str, str], min_runtime: str, files: Mapping[str, FileEntry] | None = None,
                   created_at: str | None = None) -> dict[str, Any]:
    """The manifest of ``directory`` as a dict (hashes every file unless ``files`` is given)."""
    files = scan(directory) if files is None else files
    return {
        "format_version": FORMAT_VERSION,
        "artifact_id": artifact_id(files),
        "content_sha256": content_digest(files),
        "created_at": created_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": dict(source),
        "weight_format": dict(weight_format),
        "tools": dict(tools),
        "min_runtime": {"openvino": min_runtime},
        "total_size": sum(e.size for e in files.values()),
        "files": {name: asdict(files[name]) for name in sorted(files)},
    }


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> Path:
    path = Path(directory) / MANIFEST_NAME
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed manifest; ``ArtifactError`` (check 'manifest') if absent, unreadable or malformed."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ArtifactError("manifest", directory, "the directory does not exist",
                            "set VLFLEET_MODEL_DIR to the artifact directory (the one holding manifest.json)")
    if not path.is_file():
        raise ArtifactError("manifest", directory, f"{MANIFEST_NAME} is missing",
                            "point at an artifact made by `vlfleet model.convert`/`model.build` (they write it), "
                            "or " + _FIX_REBUILD)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError("manifest", directory, f"{MANIFEST_NAME} is not readable JSON ({e})", _FIX_REBUILD) from e
    problem = _manifest_shape_problem(data)
    if problem:
        raise ArtifactError("manifest", directory, f"{MANIFEST_NAME} {problem}", _FIX_REBUILD)
    return data


def gguf_parts(manifest: Any) -> dict[str, str] | None:
    """The one rule for a GGUF artifact (``ops.llamacpp.gguf`` makes them; the llamacpp engine and the bench's
    llama-server run them): a manifest whose weight format is ``gguf`` and names the language model and the vision
    projector. Their file names in the artifact, by part (GGUF_PARTS); None for any other artifact (OpenVINO IR)."""
    weight_format = manifest.get("weight_format") if isinstance(manifest, Mapping) else None
    if not isinstance(weight_format, Mapping) or weight_format.get("format") != GGUF_FORMAT:
        return None
    files = weight_format.get("files")
    if not isinstance(files, Mapping) or not set(GGUF_PARTS) <= set(files):
        return None
    return {part: files[part] for part in GGUF_PARTS}


def is_gguf_artifact(directory: Path) -> bool:
    """Whether ``directory`` holds a readable manifest of a GGUF artifact (``gguf_parts``)."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST_NAME).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return gguf_parts(manifest) is not None


def _manifest_shape_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "is not a JSON object"
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        return f"has format_version {version!r}; this service reads version {FORMAT_VERSION}"
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        return "has no 'files' table"
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            return f"has a malformed entry for {name!r}"
        if name.startswith("/") or ".." in Path(name).parts:
            return f"lists a path outside the artifact: {name!r}"
    if not isinstance(data.get("min_runtime"), dict) or not isinstance(data["min_runtime"].get("openvino"), str):
        return "has no min_runtime.openvino"
    return None


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: '2026.4.1-22982-e213a14' -> (2026, 4, 1)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def version_at_least(found: str, required: str) -> bool:
    a, b = parse_version(found), parse_version(required)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))


def installed_runtime_version() -> str | None:
    """The OpenVINO runtime version installed beside this code, or None if it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openvino")
    except PackageNotFoundError:
        return None


@dataclass
class VerifyReport:
    directory: str
    mode: str  # "full" (sha256 of every file) or "cheap" (presence, sizes, runtime version)
    artifact_id: str | None = None
    manifest_error: str | None = None
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    modified: dict[str, str] = field(default_factory=dict)  # name -> what differs
    id_mismatch: str | None = None  # full mode: the manifest's id does not match its own files table
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.manifest_error or self.missing or self.extra or self.modified or self.id_mismatch
                    or self.runtime.get("ok") is False)

    def problems(self) -> list[str]:
        out = []
        if self.manifest_error:
            out.append(self.manifest_error)
        out += [f"missing: {n}" for n in self.missing]
        out += [f"extra: {n}" for n in self.extra]
        out += [f"modified: {n} ({why})" for n, why in self.modified.items()]
        if self.id_mismatch:
            out.append(self.id_mismatch)
        if self.runtime.get("ok") is False:
            out.append(f"runtime: OpenVINO {self.runtime['found']} is older than the required "
                       f"{self.runtime['required']}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problems": self.problems()}


def verify(directory: Path, full: bool = True, runtime_version: str | None = None) -> VerifyReport:
    """Compare ``directory`` with its manifest; name every missing, extra and modified file.

    ``full`` recomputes every sha256; otherwise only presence and sizes are checked. The runtime check uses
    ``runtime_version`` or, when not given, the OpenVINO installed beside this code (skipped if there is none).
    """
    directory = Path(directory)
    report = VerifyReport(str(directory), "full" if full else "cheap")
    try:
        manifest = read_manifest(directory)
    except ArtifactError as e:
        report.manifest_error = str(e)
        return report
    report.artifact_id = manifest.get("artifact_id")
    expected = {n: FileEntry(e["size"], e["sha256"]) for n, e in manifest["files"].items()}
    on_disk = set(list_files(directory))
    report.missing = sorted(set(expected) - on_disk)
    report.extra = sorted(on_disk - set(expected))
    for name in sorted(set(expected) & on_disk):
        path, want = directory / name, expected[name]
        size = path.stat().st_size
        if size != want.size:
            report.modified[name] = f"size {size} bytes, manifest says {want.size}"
        elif full and sha256_file(path) != want.sha256:
            report.modified[name] = "sha256 differs from the manifest"
    if full and artifact_id(expected) != report.artifact_id:
        report.id_mismatch = (f"manifest: artifact_id {report.artifact_id} does not match its files table "
                              f"({artifact_id(expected)}); the manifest was edited")
    required = manifest["min_runtime"]["openvino"]
    found = runtime_version or installed_runtime_version()
    report.runtime = {"required": required, "found": found,
                      "ok": None if found is None else version_at_least(found, required)}
    return report


def check_startup(directory: Path, runtime_version: str) -> dict[str, Any]:
    """The service's start gate: manifest, files present with the right sizes, runtime new enough.

    Returns the manifest; raises ``ArtifactError`` naming the first failed check and its fix. Cheap (no hashing):
    the full check is the checklist's ``verify``.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    report = verify(directory, full=False, runtime_version=runtime_version)
    if report.missing:
        raise ArtifactError("files-present", directory, f"{len(report.missing)} file(s) listed in the manifest are "
                            f"missing: {_names(report.missing)}", _FIX_REBUILD)
    if report.modified:
        raise ArtifactError("file-sizes", directory, "file(s) differ in size from the manifest: "
                            + "; ".join(f"{n}: {why}" for n, why in report.modified.items()), _FIX_REBUILD)
    required = manifest["min_runtime"]["openvino"]
    if not version_at_least(runtime_version, required):
        raise ArtifactError("runtime-version", directory,
                            f"it needs OpenVINO runtime >= {required}, this host runs {runtime_version}",
                            f"install a release whose openvino is >= {required} (rebuild the wheelhouse with "
                            "`vlfleet wheelhouse.build` and roll it out), or convert the model with the "
                            "host's OpenVINO version")
    return manifest


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.runtime.manifest",
                                     description="Check a model artifact against its manifest.json.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="report missing, extra and modified files as JSON; exit 1 on problems")
    v.add_argument("directory", type=Path, help="artifact directory (holds manifest.json)")
    v.add_argument("--full", action="store_true",
                   help="recompute sha256 of every file (default: presence, sizes and runtime version only)")
    v.add_argument("--runtime-version", help="OpenVINO version to check against (default: the installed one)")
    args = parser.parse_args(argv)
    report = verify(args.directory, full=args.full, runtime_version=args.runtime_version)
    json.dump(report.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

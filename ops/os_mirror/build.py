"""`vlfleet os-mirror.build`: the exact .debs os_packages installs, with their dependency closure, in a flat
repository under the cache, keyed by what went into it (suite, mirror, packages, the status resolved against)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ops.os_mirror import MirrorError, index, needs
from ops.os_mirror.apt_root import AptRoot, Download, Source
from ops.paths import cache_root, locked

FORMAT = 1  # bump when the repository's layout changes: older builds are then rebuilt, not reused


@dataclass(frozen=True)
class MirrorSpec:
    suite: str = "bookworm"
    mirror: str = ""  # empty: the controller's apt source for the suite (as staging images use)
    needs: tuple[str, ...] = ()  # empty: every need os_packages knows
    status: Path | None = None  # a host's /var/lib/dpkg/status: only what it lacks is fetched
    keyring: str = ""  # empty: the distribution's archive keyring
    suites: tuple[str, ...] = ()  # empty: the suite and its distribution's usual pockets

    def source(self) -> Source:
        from ops.staging.image import default_mirror
        from ops.staging.system import StagingError

        d = needs.distro(self.suite)
        try:
            mirror = (self.mirror or default_mirror(self.suite)).rstrip("/")
        except StagingError as e:
            raise MirrorError(str(e)) from e
        keyring = self.keyring or d.keyring
        if not Path(keyring).is_file():
            fix = d.keyring_fix if not self.keyring else "pass an existing --keyring"
            raise MirrorError(f"keyring {keyring} is missing, so {self.suite}'s signatures cannot be verified: {fix}")
        suites = self.suites or (self.suite, *(self.suite + p for p in d.pockets))
        return Source(mirror, tuple(suites), d.components, keyring)


@dataclass
class Mirror:
    path: Path
    packages: list[str]  # what was asked for (os_packages' names)
    debs: list[str] = field(default_factory=list)  # what the repository holds
    reused: bool = False

    def apt_line(self, url: str) -> str:
        return f"deb [trusted=yes] {url.rstrip('/')}/ ./"


def mirrors_dir() -> Path:
    d = cache_root() / "os-mirror"
    d.mkdir(parents=True, exist_ok=True)
    return d


def key(spec: MirrorSpec, source: Source, packages: list[str]) -> str:
    status = hashlib.sha256(spec.status.read_bytes()).hexdigest() if spec.status else ""
    blob = json.dumps([FORMAT, source.mirror, source.suites, source.components, source.keyring, packages, status])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def plan(spec: MirrorSpec, role_dir: Path | None = None) -> list[str]:
    """The packages to ask apt for: os_packages' choice per need, minus needs the status already meets."""
    present = None
    if spec.status is not None:
        if not spec.status.is_file():
            raise MirrorError(f"--status {spec.status} does not exist: copy a host's /var/lib/dpkg/status here")
        present = needs.installed(spec.status.read_text(errors="replace"))
    return needs.wanted(needs.role_names(spec.suite, role_dir), list(spec.needs) or None, present)


def build(spec: MirrorSpec, *, refresh: bool = False, echo: Callable[[str], None] = print) -> Mirror:
    source = spec.source()
    packages = plan(spec)
    out = mirrors_dir() / f"{spec.suite}-{key(spec, source, packages)}"
    with locked(out):
        if (out / "mirror.json").is_file() and not refresh:
            echo(f"os-mirror: reusing {out}")
            (mirrors_dir() / "last").write_text(f"{out}\n")
            return Mirror(out, packages, json.loads((out / "mirror.json").read_text())["debs"], reused=True)
        return _build(spec, source, packages, out, echo)


def _build(spec: MirrorSpec, source: Source, packages: list[str], out: Path, echo: Callable[[str], None]) -> Mirror:
    t0 = time.monotonic()
    # One apt root per upstream source: its lists and downloaded .debs serve later builds too.
    apt_key = hashlib.sha256(source.lines().encode()).hexdigest()[:12]
    apt = AptRoot(mirrors_dir() / "apt" / f"{spec.suite}-{apt_key}", source)
    work = out.with_name(out.name + ".partial")
    with locked(apt.root):  # builds for other statuses share this root (its config names the status)
        apt.prepare(spec.status)
        echo(f"os-mirror: {', '.join(source.suites)} from {source.mirror} (signatures: {source.keyring})")
        apt.update(echo=echo)
        downloads = apt.resolve(packages) if packages else []
        what = f"{len(downloads)} .debs, {sum(d.size for d in downloads) / 1e6:.1f} MB"
        echo(f"os-mirror: {', '.join(packages) or 'nothing'} missing" + (f" -> {what}" if packages else ""))
        if downloads:
            apt.download(packages, echo=echo)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _collect(apt.archives, downloads, work)
    index.write(work, f"vlfleet os-mirror {spec.suite}", time.time())
    meta = {"suite": spec.suite, "mirror": source.mirror, "suites": list(source.suites),
            "keyring": source.keyring, "packages": packages, "debs": sorted(pool_name(d) for d in downloads),
            "status": str(spec.status or ""), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (work / "mirror.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    (mirrors_dir() / "last").write_text(f"{out}\n")
    echo(f"os-mirror: {out} ready in {time.monotonic() - t0:.0f} s ({what})")
    return Mirror(out, packages, meta["debs"])


def pool_name(d: Download) -> str:
    """The archive's own file name (no epoch, no %3a): apt keeps an epoch in its cache's names as `%3a`, which an
    HTTP server would decode to `:` and then not find."""
    return urllib.parse.unquote(d.uri.rsplit("/", 1)[-1])


def _collect(archives: Path, downloads: list[Download], work: Path) -> None:
    for d in downloads:
        src = archives / d.filename
        if not src.is_file() or src.stat().st_size != d.size:
            raise MirrorError(f"apt did not leave {d.filename} ({d.size} bytes) in {archives}: run again with "
                              f"--refresh")
        dest = work / pool_name(d)
        try:
            os.link(src, dest)  # same filesystem: no second copy
        except OSError:
            shutil.copy2(src, dest)


def last_built() -> Path | None:
    marker = mirrors_dir() / "last"
    path = Path(marker.read_text().strip()) if marker.is_file() else None
    return path if path and (path / "Release").is_file() else None

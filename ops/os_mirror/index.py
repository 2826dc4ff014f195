"""The flat repository's index, written in Python so the controller needs no dpkg-dev or apt-utils: a Packages
stanza per .deb (its control fields from `dpkg-deb -f`, then where it is, its size and hashes), Packages.gz, and a
Release holding the indexes' sizes and hashes (apt checks them even for a `trusted=yes` source)."""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path

from ops.os_mirror import MirrorError

# Fields the index adds; a control file carrying one would make the stanza ambiguous.
_INDEX_FIELDS = ("Filename", "Size", "MD5sum", "SHA1", "SHA256")
_HASHES = (("MD5Sum", "md5"), ("SHA256", "sha256"))


def control_text(deb: Path) -> str:
    """The .deb's control fields, formatted as dpkg writes them (continuation lines kept)."""
    try:
        done = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise MirrorError("dpkg-deb not found: install dpkg (any Debian or Ubuntu controller has it)") from e
    if done.returncode != 0:
        raise MirrorError(f"{deb.name} is not a readable .deb: {done.stderr.strip()}")
    return done.stdout


def field(stanza: str, name: str) -> str:
    for line in stanza.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name and not line[:1].isspace():
            return value.strip()
    return ""


def file_digests(path: Path) -> dict[str, str]:
    digests = {algo: hashlib.new(algo) for _, algo in _HASHES}
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            for d in digests.values():
                d.update(block)
    return {algo: d.hexdigest() for algo, d in digests.items()}


def stanza(control: str, filename: str, size: int, digests: dict[str, str]) -> str:
    body = control.strip("\n")
    if not body.startswith("Package:"):
        raise MirrorError(f"{filename}: control fields do not start with Package:")
    clash = [f for f in _INDEX_FIELDS if field(body, f)]
    if clash:
        raise MirrorError(f"{filename}: control fields already carry {', '.join(clash)}")
    return (f"{body}\nFilename: ./{filename}\nSize: {size}\n"
            f"MD5sum: {digests['md5']}\nSHA256: {digests['sha256']}\n")


def packages_text(debs: Iterable[Path]) -> str:
    """Packages for ``debs``, sorted by package, version and file name so the same set gives the same index."""
    stanzas = []
    for deb in debs:
        control = control_text(deb)
        text = stanza(control, deb.name, deb.stat().st_size, file_digests(deb))
        stanzas.append(((field(control, "Package"), field(control, "Version"), deb.name), text))
    return "\n".join(text for _, text in sorted(stanzas))


def release_text(directory: Path, indexes: Iterable[str], label: str, date: float) -> str:
    lines = ["Origin: vlfleet", f"Label: {label}", f"Date: {email.utils.formatdate(date, usegmt=True)}",
             "Architectures: amd64 all", "Description: distribution packages for vlfleet's roles (os_packages)"]
    files = [(name, (directory / name).stat().st_size, file_digests(directory / name)) for name in indexes]
    for title, algo in _HASHES:
        lines.append(f"{title}:")
        lines += [f" {digests[algo]} {size:>10} {name}" for name, size, digests in files]
    return "\n".join(lines) + "\n"


def write(directory: Path, label: str, date: float) -> list[str]:
    """Index every .deb in ``directory``; returns the index files written."""
    text = packages_text(sorted(directory.glob("*.deb")))
    (directory / "Packages").write_text(text)
    # mtime 0: the same Packages gives byte-identical Packages.gz
    with gzip.GzipFile(directory / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(text.encode())
    (directory / "Release").write_text(release_text(directory, ("Packages", "Packages.gz"), label, date))
    return ["Packages", "Packages.gz", "Release"]

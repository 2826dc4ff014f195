"""The host program (ops/host/) as one file: built into a zipapp, cached by the digest of its sources, and put on a
host the same way by every caller: uploaded to contract.HOST_PROGRAM_DIR, checked by sha256, run with a Python of the
host (`sudo python3 <program> COMMAND ARGS`)."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tempfile
import uuid
import zipapp
from dataclasses import dataclass
from pathlib import Path

from ops import host as host_package
from ops.paths import cache_root, locked
from service.runtime.contract import HOST_PROGRAM_DIR

SOURCE = Path(host_package.__file__).parent
PACKAGE = "vlfleet_host"  # its name inside the archive, so it needs nothing of ops/ on the host


class StepError(RuntimeError):
    """A host program step failed on a host: its error, a bad answer, or the program could not be put there."""


@dataclass(frozen=True)
class Program:
    path: Path  # the archive on the controller
    sha256: str

    @property
    def remote(self) -> str:
        """Where it goes on a host: the name carries its content, so hosts keep one file per version."""
        return f"{HOST_PROGRAM_DIR}/{self.path.name}"


def build() -> Program:
    """The archive of the current sources (built once per source digest; parallel builds wait for each other)."""
    sources = sorted(SOURCE.glob("*.py"))
    digest = hashlib.sha256()
    for src in sources:
        digest.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    path = cache_root() / "host-program" / f"vlfleet-host-{digest.hexdigest()[:16]}.pyz"
    with locked(path):
        if not path.is_file():
            with tempfile.TemporaryDirectory() as tmp:
                package = Path(tmp) / "src" / PACKAGE
                package.mkdir(parents=True)
                for src in sources:
                    shutil.copy2(src, package / src.name)
                built = Path(tmp) / path.name
                zipapp.create_archive(package.parent, built, main=f"{PACKAGE}.cli:run")
                built.replace(path)
    return Program(path, hashlib.sha256(path.read_bytes()).hexdigest())


def ensure(conn, program: Program) -> str:
    """Put ``program`` on the host of Fabric connection ``conn`` unless it is there with its sha256; its path there."""
    remote = shlex.quote(program.remote)
    have = conn.run(f"sha256sum {remote}", hide=True, warn=True, in_stream=False, timeout=60)
    if have.ok and have.stdout.split()[:1] == [program.sha256]:
        return program.remote
    tmp = f"/tmp/.{program.path.name}.{uuid.uuid4().hex[:8]}"
    conn.put(str(program.path), tmp)
    done = conn.run(f"sudo -n install -D -o root -g root -m 0644 {tmp} {remote}; rc=$?; rm -f {tmp}; "
                    f"[ $rc = 0 ] && sha256sum {remote}", hide=True, warn=True, in_stream=False, timeout=60)
    if not done.ok or done.stdout.split()[:1] != [program.sha256]:
        raise StepError(f"could not install the host program at {program.remote}: "
                        f"{(done.stderr or done.stdout).strip()[-300:] or 'sha256 differs'}")
    return program.remote

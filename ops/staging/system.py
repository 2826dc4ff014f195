"""Running controller-side commands for staging, with errors that say what to install or do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

# Tool -> Debian package that provides it, so a missing tool is a one-line fix for the operator.
TOOL_PACKAGES = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "qemu-system-x86_64": "qemu-system-x86",
    "mkfs.ext4": "e2fsprogs",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "chroot": "coreutils",
    "mount": "mount",
    "umount": "mount",
}


class StagingError(RuntimeError):
    """A failure the operator can act on; the message says what went wrong and what to do."""


def log(msg: str) -> None:
    print(f"[staging] {msg}", file=sys.stderr, flush=True)


def require_root() -> None:
    if os.geteuid() != 0:
        raise StagingError("staging fleets need root (network namespaces, mounts, nspawn): run as root or with sudo")


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pkgs = sorted({TOOL_PACKAGES.get(t, t) for t in missing})
        raise StagingError(f"missing tool(s) {', '.join(missing)}: install with `apt-get install {' '.join(pkgs)}`")


def run(cmd: Sequence[str], *, check: bool = True, timeout: float = 600, input: str | None = None) -> str:
    """Run ``cmd``; on failure raise StagingError carrying the command and its stderr."""
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as e:
        raise StagingError(
            f"{cmd[0]} not found: install with `apt-get install {TOOL_PACKAGES.get(cmd[0], cmd[0])}`"
        ) from e
    except subprocess.TimeoutExpired as e:
        raise StagingError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from e
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-2000:]
        raise StagingError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {err}")
    return proc.stdout

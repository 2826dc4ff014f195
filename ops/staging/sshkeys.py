"""The fleet's SSH key and the SSH options every client (Ansible, testinfra, Fabric, tests) uses for staging."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ops.staging.system import StagingError, run

# Staging hosts are recreated with fresh host keys: never prompt, never remember them.
COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


def ensure_key(path: Path) -> Path:
    """An ed25519 key pair at ``path``/``path``.pub, generated once per fleet."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"vlfleet-staging-{path.parent.name}",
             "-f", str(path)])
    return path


def ssh_argv(ip: str, key: Path, user: str = "deploy", connect_timeout: int = 5) -> list[str]:
    return ["ssh", "-i", str(key), *COMMON_ARGS.split(), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"ConnectTimeout={connect_timeout}", f"{user}@{ip}"]


def ssh_run(ip: str, key: Path, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ssh_argv(ip, key), command], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def port_open(ip: str, port: int = 22, timeout: float = 5) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            # sshd sends its banner first; an accepted-then-closed connection is not sshd being ready.
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_ssh(ip: str, key: Path, timeout: float, alive: Callable[[], bool], what: str) -> float:
    """Poll until `ssh deploy@ip true` works; bounded by ``timeout``. Returns seconds waited."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = ""
    while time.monotonic() < deadline:
        if not alive():
            raise StagingError(f"{what} exited while booting")
        if port_open(ip):
            try:
                res = ssh_run(ip, key, "true", timeout=30)
            except subprocess.TimeoutExpired:
                last = "ssh timed out"
            else:
                if res.returncode == 0:
                    return time.monotonic() - t0
                last = res.stderr.strip()
        time.sleep(2)
    raise StagingError(f"{what} did not answer SSH on {ip} within {timeout:.0f} s" + (f" (last: {last})" if last
                                                                                       else ""))

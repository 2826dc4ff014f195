"""Commands on staging hosts over real SSH, as the inventory's deploy user (with sudo)."""

from __future__ import annotations

import shlex
import subprocess


def ssh(host: dict, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    args = ["ssh", "-i", host["ansible_ssh_private_key_file"], *host["ansible_ssh_common_args"].split(),
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"{host['ansible_user']}@{host['ansible_host']}",
            command]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def sudo(host: dict, command: str, timeout: float = 120) -> str:
    """``command`` run by root's sh; single-quoted, so the login shell expands nothing in it (not $(...) nor $x)."""
    done = ssh(host, f"sudo sh -c {shlex.quote(command)}", timeout)
    assert done.returncode == 0, f"{command!r} on {host['ansible_host']}: {done.stderr}"
    return done.stdout

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


def service_pids(host: dict) -> list[int]:
    """vlfleet.service's MainPID (the launcher, exec'd into gunicorn's master) and its children (the worker). Not the
    cgroup file: its path differs between unified and hybrid hierarchies (nspawn containers)."""
    procs = sudo(host, "m=$(systemctl show -p MainPID --value vlfleet.service); ps -o pid= -p $m --ppid $m").split()
    assert procs, "vlfleet.service has no processes"
    return [int(p) for p in procs]

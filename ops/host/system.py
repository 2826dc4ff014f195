"""Processes, systemd units, cgroups and files as root: what the steps share."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from .errors import HostError


def run(argv: list[str], timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise HostError(f"{' '.join(argv[:3])} failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-600:]}")
    return done.stdout


UNIT_STATE = "ActiveState,SubState,MainPID,NRestarts,ControlGroup,ExecMainStatus"


def unit_state(unit: str, properties: str = UNIT_STATE) -> dict[str, str]:
    out = run(["systemctl", "show", f"{unit}.service", "-p", properties])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal_tail(unit: str, since: float | None = None, lines: int = 25) -> list[str]:
    argv = ["journalctl", "-u", f"{unit}.service", "-n", str(lines), "--no-pager", "-o", "cat"]
    if since:
        argv += ["--since", f"@{int(since)}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.splitlines()[-lines:]


def restart_unit(unit: str, stop_timeout: float) -> tuple[float, int]:
    """Restart the unit (clearing a start limit first): when (for its journal since) and its restart count after."""
    since = time.time()
    # A crash-looping release may have hit the unit's start limit; a deliberate restart must not be refused.
    subprocess.run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, timeout=30)
    run(["systemctl", "restart", f"{unit}.service"], timeout=stop_timeout)
    return since, int(unit_state(unit).get("NRestarts") or 0)


def write_atomic(path: Path, data: bytes, mode: int, gid: int = 0, check: bool = False) -> bool:
    """Write ``path`` (root:``gid``, ``mode``) through a temporary file and rename; return whether the content, mode
    or owner changed. With ``check``, only say whether it would."""
    try:
        st = path.stat()
        same = path.read_bytes() == data and (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, 0, gid)
    except OSError:
        same = False
    if same or check:
        return not same
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chown(tmp, 0, gid)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def group_id(name: str) -> int:
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise HostError(f"group {name!r} does not exist: converge the host with site.yml first") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def cgroup_file(cgroup: str, name: str, fs: Path = Path("/sys/fs/cgroup")) -> str | None:
    """A file of a unit's cgroup (its ControlGroup property); None without a cgroup or the file."""
    # cgroup v2 at the root; hybrid layouts (some containers) keep the unit's processes under unified/ or systemd/
    for base in (fs, fs / "unified", fs / "systemd") if cgroup else ():
        try:
            return (base / cgroup.lstrip("/") / name).read_text()
        except OSError:
            continue
    return None


def cgroup_rss(cgroup: str, fs: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc"),
               field: str = "VmRSS:") -> int | None:
    """Sum of VmRSS (or another /proc/PID/status field in kB, e.g. VmHWM: the peak) over the unit's processes (the
    gunicorn master, its worker, and a llama-server child when there is one)."""
    pids = (cgroup_file(cgroup, "cgroup.procs", fs) or "").split()
    if not pids:
        return None
    total = 0
    for pid in pids:
        try:
            for line in (proc / pid / "status").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total

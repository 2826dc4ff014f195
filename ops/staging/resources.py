"""Checking for and removing the system objects recorded in state.json (processes, links, netns, mounts, files)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ops.staging.state import Resource

# Host processes started by this Python process, kept referenced: a collected Popen of a still-running child
# warns, and keeping it lets `reap` collect the exit status once `down` stops it.
_children: dict[int, subprocess.Popen] = {}


def adopt(proc: subprocess.Popen) -> None:
    _children[proc.pid] = proc


def spawn(argv: list[str], output: Path, *, append: bool = False) -> tuple[subprocess.Popen, str]:
    """Start a host process (systemd-nspawn, qemu) in its own session, stdout and stderr to ``output``.

    Returns it and its kernel start time, or "" when it exited at once (a refused argv)."""
    with open(output, "ab" if append else "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    adopt(proc)
    time.sleep(0.5)
    return proc, (proc_start_time(proc.pid) if proc.poll() is None else "")


def proc_start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): pid plus this identifies one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; fields after it start past the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def process_alive(res: Resource) -> bool:
    pid = int(res.id)
    start = proc_start_time(pid)
    if not start or start != res.extra.get("start_time"):
        return False
    # A zombie we started (child of this process) is not a live host.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mounted(path: str) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def _ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


def exists(res: Resource) -> bool:
    if res.kind == "process":
        return process_alive(res)
    if res.kind == "link":
        return Path(f"/sys/class/net/{res.id}").exists()
    if res.kind == "netns":
        return Path(f"/run/netns/{res.id}").exists()
    if res.kind == "mount":
        return mounted(res.id)
    return os.path.lexists(res.id)


def remove(res: Resource, stop_timeout: float = 30) -> None:
    """Remove one recorded object; absent already counts as removed. Raises RuntimeError when it stays."""
    if not exists(res):
        return
    if res.kind == "process":
        _stop_process(res, stop_timeout)
    elif res.kind == "link":
        subprocess.run(["ip", "link", "del", "dev", res.id], capture_output=True, timeout=30)
    elif res.kind == "netns":
        subprocess.run(["ip", "netns", "del", res.id], capture_output=True, timeout=30)
    elif res.kind == "mount":
        if not _ok(["umount", res.id]):
            # Busy after its processes ended (e.g. a shell of the operator inside): detach it lazily.
            _ok(["umount", "--lazy", res.id])
    elif res.kind == "dir":
        # --one-file-system: never follow into a mount that is still there (e.g. a host root).
        subprocess.run(["rm", "-rf", "--one-file-system", res.id], capture_output=True, timeout=300)
    elif res.kind == "file":
        Path(res.id).unlink(missing_ok=True)
    if exists(res):
        raise RuntimeError(f"could not remove {res.label()}")


def _stop_process(res: Resource, timeout: float) -> None:
    pid = int(res.id)
    # SIGTERM makes systemd-nspawn power the container off cleanly; qemu just exits.
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process_alive(res):
        reap(pid)
        time.sleep(0.2)
    if process_alive(res):
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            reap(pid)
            if not process_alive(res):
                break
            time.sleep(0.1)
    reap(pid)


def reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            _children.pop(pid, None)
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)

"""Peak resident memory of a process: the kernel's high-water mark (VmHWM), no sampling gaps."""

from __future__ import annotations

import os
import resource


def parse_status_kib(status_text: str, key: str) -> int | None:
    """``key`` (e.g. "VmHWM") from /proc/PID/status text, in bytes; None when absent."""
    for line in status_text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0]) * 1024
    return None


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM of a live process (None once it has gone or on a kernel without /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return parse_status_kib(f.read(), "VmHWM")
    except OSError:
        return None


def memory_status(pid: int) -> dict[str, int | None]:
    """Peak and current RSS of ``pid`` and how the current one splits: anonymous vs file-backed (mmap'd weights)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return {}
    return {key: parse_status_kib(text, key) for key in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}


def own_peak_rss_bytes() -> int:
    peak = peak_rss_bytes(os.getpid())
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (gunicorn's worker is the master's child)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def tree_peak_rss_bytes(pid: int) -> int | None:
    """The sum of VmHWM over ``pid`` and all its descendants: what a host's tune reads over the unit's cgroup, so an
    engine with a child process (llamacpp's llama-server) is not measured by its worker alone. Descendants come from
    psutil (every process's parent), not /proc/PID/task/PID/children: a child started by another thread (the
    inference thread starts llama-server) is listed only under that thread's task."""
    import psutil

    try:
        pids = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return None
    present = [p for p in map(peak_rss_bytes, pids) if p is not None]
    return sum(present) if present else None

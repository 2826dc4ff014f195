"""Controller kernel limits that container hosts need.

Every booted systemd (one per container host) takes inotify instances; the kernel default of 128 per user
runs out after a few fleets, and a container's systemd then dies with "Too many open files".
"""

from __future__ import annotations

from pathlib import Path

MINIMUMS = {
    "fs/inotify/max_user_instances": 8192,
    "fs/inotify/max_user_watches": 524288,
}


def ensure(proc_sys: Path = Path("/proc/sys"), log=print) -> None:
    """Raise each limit to its minimum if it is lower (never lowers one); ``log`` adds its own prefix."""
    for name, minimum in MINIMUMS.items():
        path = proc_sys / name
        try:
            current = int(path.read_text())
            if current < minimum:
                path.write_text(str(minimum))
                log(f"raised {name.replace('/', '.')} from {current} to {minimum} for container hosts")
        except (OSError, ValueError) as e:
            log(f"could not raise {name.replace('/', '.')}: {e}; containers may fail to boot")

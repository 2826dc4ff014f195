"""Load shedding under memory pressure: stop admitting work above a high-water mark, resume below a low one.

Two signals: the process RSS against its limit (VLFLEET_MEMORY_LIMIT_MB, else the unit's cgroup MemoryHigh), with
high and low water marks; and the share of system memory in use, against its own (higher) mark, because other
processes on the host move it and a dedicated host runs fine at 80 %. Queued and running requests still
complete; new ones get 503 with Retry-After, /readyz reports not ready so nginx and rollouts route around the
host, and caches are trimmed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

log = logging.getLogger("vlfleet.memory")


def cgroup_memory_high(proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """MemoryHigh of this process's cgroup (v2) in bytes, or None when unset ('max') or unknown."""
    try:
        for line in (proc_root / "self" / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                raw = (cgroup_root / line[3:].lstrip("/") / "memory.high").read_text().strip()
                return None if raw == "max" else int(raw)
    except (OSError, ValueError):
        return None
    return None


def release_freed_memory() -> None:
    """Return freed heap pages to the OS, so RSS reflects what is really in use after a trim."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MemoryGuard:
    def __init__(self, limit_bytes: int | None, high: float, low: float, on_trim: Callable[[], None] = lambda: None,
                 metrics=None, interval: float = 0.5, system_high: float = 0.95):
        self.limit_bytes = limit_bytes
        self.high, self.low = high, low
        self.system_high = system_high
        self.system = 0.0
        self.on_trim = on_trim
        self.metrics = metrics
        self.interval = interval
        self.shedding = False
        self.pressure = 0.0
        self.rss = 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def sample(self) -> float:
        """Process pressure (RSS / limit); also refreshes the system share in ``self.system``."""
        self.rss = self._process.memory_info().rss
        system = psutil.virtual_memory()
        self.system = 1.0 - system.available / system.total
        self.pressure = self.rss / self.limit_bytes if self.limit_bytes else 0.0
        return self.pressure

    def update(self) -> None:
        if self.shedding:
            release_freed_memory()  # finished requests' buffers go back to the OS, so recovery shows in RSS
        pressure = self.sample()
        system_margin = self.high - self.low  # the same hysteresis for both signals
        if not self.shedding and (pressure >= self.high or self.system >= self.system_high):
            self.shedding = True
            log.warning("memory pressure: shedding new requests", extra=self._figures())
            self.on_trim()
            release_freed_memory()
        elif self.shedding and pressure <= self.low and self.system <= self.system_high - system_margin:
            self.shedding = False
            log.info("memory pressure relieved: admitting requests again", extra=self._figures())
        if self.metrics:
            self.metrics.memory_pressure.set(max(pressure, self.system))
            self.metrics.rss.set(self.rss)
            self.metrics.shedding.set(1 if self.shedding else 0)

    def reason(self) -> str:
        limit = f"of its {self.limit_bytes // 2**20} MiB limit" if self.limit_bytes else "(no limit set)"
        return (f"shedding load: memory at {self.pressure:.0%} {limit} (RSS {self.rss // 2**20} MiB), system memory "
                f"{self.system:.0%} in use; admitting again below {self.low:.0%} and "
                f"{self.system_high - (self.high - self.low):.0%}")

    def _figures(self) -> dict:
        return {"pressure": round(self.pressure, 3), "system": round(self.system, 3), "rss_mib": self.rss // 2**20,
                "limit_mib": (self.limit_bytes or 0) // 2**20}

    def start(self) -> None:
        def loop():
            while not self._stop.wait(self.interval):
                try:
                    self.update()
                except Exception:  # a failed sample must never take the guard down
                    log.exception("memory sample failed")
        self.update()
        threading.Thread(target=loop, name="memory-guard", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

"""Stopping a child process we started: SIGTERM to its PID, a grace period, then SIGKILL (never by name)."""

from __future__ import annotations

import signal
import subprocess


def terminate(proc: subprocess.Popen | None, grace: float = 30.0) -> None:
    """End ``proc`` if it still runs: SIGTERM lets a server finish open streams within ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)

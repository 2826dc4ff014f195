"""Child processes we start (the service's llama.cpp children, the controller's converters, benches and servers):
they die with us, and we stop them by their PID (never by name). Standard library only.

SIGTERM to its PID, a grace period, then SIGKILL; a child armed with ``die_with_parent`` also gets a signal from
the kernel when the process that started it dies without stopping it (PR_SET_PDEATHSIG), so a killed convert or
bench leaves no orphan behind. ``sigterm_as_interrupt`` makes SIGTERM unwind like Ctrl-C, so ``finally`` blocks and
context managers stop the children and keep what was measured.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Iterator

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when its parent (the thread that started it) goes away. prctl is
    looked up here, before fork, so the child only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:  # runs in the child between fork and exec
        prctl(PR_SET_PDEATHSIG, sig)
    return arm


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


def kill_session(proc: subprocess.Popen | None) -> None:
    """SIGKILL what is left of the session ``proc`` leads (started with start_new_session=True), once it has ended:
    a gunicorn worker whose master is gone (seen: one stuck in the interpreter's exit, holding its port)."""
    if proc is None or proc.poll() is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

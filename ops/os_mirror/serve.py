"""Serve a built mirror read-only over HTTP with the standard library: GET and HEAD of its files, nothing else.

Bounded: each connection has a socket timeout, handler threads are daemons (a stuck client cannot hold the
process at exit), and `serve(..., seconds=N)` stops by itself."""

from __future__ import annotations

import contextlib
import functools
import http.server
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ops.os_mirror import MirrorError

REQUEST_TIMEOUT = 60.0  # seconds a connection may sit idle


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT

    def list_directory(self, path):  # an apt repository needs no listings
        self.send_error(404)
        return None

    def log_message(self, format, *args):
        self.server.log(f"{self.client_address[0]} {format % args}", self.path)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, quiet: bool):
        super().__init__(address, handler)
        self.quiet = quiet
        self.requests: list[str] = []  # paths asked for, for callers that check what hosts fetched

    def log(self, line: str, path: str) -> None:
        self.requests.append(path)
        if not self.quiet:
            sys.stderr.write(f"[os-mirror] {line}\n")


@dataclass
class Served:
    url: str
    requests: list[str] = field(default_factory=list)


def _server(root: Path, bind: str, port: int, quiet: bool) -> _Server:
    if not (root / "Release").is_file():
        raise MirrorError(f"{root} holds no built mirror (no Release): run `vlfleet os-mirror.build` first")
    try:
        return _Server((bind, port), functools.partial(_Handler, directory=str(root)), quiet)
    except OSError as e:
        raise MirrorError(f"cannot listen on {bind}:{port}: {e.strerror}; pick another --port, or an address "
                          f"of this machine (e.g. the staging bridge's .1) for --bind") from e


@contextlib.contextmanager
def running(root: Path, bind: str, port: int = 0, quiet: bool = True) -> Iterator[Served]:
    """Serve ``root`` from a background thread while the block runs (port 0: a free one)."""
    server = _server(root, bind, port, quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    try:
        yield Served(f"http://{bind}:{server.server_address[1]}/", server.requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def serve(root: Path, bind: str, port: int, seconds: float = 0) -> None:
    """Serve in the foreground until Ctrl-C, or for ``seconds`` when > 0."""
    server = _server(root, bind, port, quiet=False)
    if seconds > 0:
        timer = threading.Timer(seconds, server.shutdown)
        timer.daemon = True
        timer.start()
    until = f"for {seconds:.0f} s" if seconds > 0 else "until Ctrl-C"
    print(f"serving {root} at http://{bind}:{server.server_address[1]}/ {until}", flush=True)
    t0 = time.monotonic()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print(f"stopped after {time.monotonic() - t0:.0f} s", flush=True)

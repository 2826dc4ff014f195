"""The service as users run it (`vlfleet serve`), started and stopped by a benchmark, with its readiness time
and the peak RSS of the process that holds the model."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ops.bench.memory import children, memory_status, peak_rss_bytes, tree_peak_rss_bytes
from ops.host import client
from service.runtime.processes import die_with_parent, kill_session, terminate

# Benchmarks measure generation: repeated prompts must not be answered from the answer cache.
BENCH_ENV = {"VLFLEET_MAX_TOKENS": "4096", "VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_QUEUE_SIZE": "32",
             "VLFLEET_LOG_LEVEL": "warning"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a benchmark's service runs with: this process's, the bench settings, then ``env``."""
    return {**os.environ, **BENCH_ENV, **(env or {})}


def model_size(png: bytes, model: Path, env: dict[str, str] | None = None,
               detail: str | None = None) -> tuple[int, int]:
    """(width, height) of ``png`` as the service started with ``env`` feeds it to the model: the service's own
    preparation (service.engine.images.prepare) under the image limits of its settings for ``detail`` (auto when
    None)."""
    from service.engine.images import prepare
    from service.http.image_source import limits_by_detail
    from service.runtime.settings import load

    return prepare(png, limits_by_detail(load(service_env(env), model_dir=model))[detail or "auto"]).size


def start_service(model: Path, port: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    vlfleet = Path(sys.executable).with_name("vlfleet")
    with open(log, "wb") as out:
        # SIGTERM, not SIGKILL, if the bench dies: gunicorn then stops its worker (which holds the model) too.
        return subprocess.Popen([str(vlfleet), "serve", "--model", str(model), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=service_env(env),
                                preexec_fn=die_with_parent(signal.SIGTERM), start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 900, log: Path | None = None) -> None:
    """Wait (bounded) for the started service's /readyz 200 (client.NotReady, a RuntimeError, when it will not)."""
    def exited() -> str | None:
        if proc.poll() is None:
            return None
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
        return f"service exited (code {proc.returncode}) before becoming ready\n{tail}"

    client.wait_ready(url, timeout, alive=exited)


class Server:
    """``with Server(model, env) as s:`` starts the service, waits for /readyz, and stops it on exit."""

    def __init__(self, model: Path, log: Path, env: dict[str, str] | None = None, ready_timeout: float = 900):
        self.model, self.log, self.env, self.ready_timeout = model, log, env or {}, ready_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.cold_start_s: float | None = None

    def __enter__(self) -> Server:
        started = time.perf_counter()
        self.proc = start_service(self.model, self.port, self.log, self.env)
        try:
            wait_ready(self.url, self.proc, self.ready_timeout, self.log)
        except BaseException:
            self.stop()
            raise
        # Process start to /readyz 200: interpreter, imports, model compile, warm-up generation.
        self.cold_start_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def worker_pid(self) -> int | None:
        """gunicorn runs the app (and the model) in its one worker, a child of the `vlfleet serve` master."""
        if self.proc is None:
            return None
        kids = children(self.proc.pid)
        return kids[0] if kids else None

    def peak_rss(self) -> dict[str, int | None]:
        worker = self.worker_pid()
        return {"worker": peak_rss_bytes(worker) if worker else None, "master": peak_rss_bytes(self.proc.pid),
                "all": tree_peak_rss_bytes(self.proc.pid)}

    def memory(self) -> dict[str, int | None]:
        worker = self.worker_pid()
        return memory_status(worker) if worker else {}

    def stop(self) -> None:
        terminate(self.proc, 60)
        kill_session(self.proc)

"""Start the real service the way users do (`vlfleet serve`, gunicorn) and stop it by its PID."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from service.runtime.processes import kill_session, terminate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode(), e.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.1) -> float:
    """Poll ``predicate`` until it is true; return the seconds it took, or fail after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, sample: str) -> float:
        """The value of one sample of /metrics, e.g. 'vlfleet_queue_depth' or 'x_total{reason="429"}'; 0 if absent."""
        text = get(self.url + "/metrics")[1]
        match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def inference_lines(self, request_id: str | None = None) -> list[dict]:
        """The service's JSON "inference" log lines (one per answer), in order; those of one request if given."""
        text = self.log()
        complete = text[:text.rfind("\n") + 1]  # a line being written is read on a later call
        lines = [json.loads(line) for line in complete.splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("msg") == "inference"
                and (request_id is None or line.get("request_id") == request_id)]

    def wait_inference_lines(self, *request_ids: str, timeout: float = 10.0) -> list[list[dict]]:
        """The inference lines of each request, once every one of them has one.

        A generated answer's line is written after its Done event was sent (service/engine/base.py ``_finish``), so
        it can come after the response, and after the line of a later request answered from the cache: wait for
        every line a test reads, not only for the last request's.
        """
        wait_for(lambda: all(self.inference_lines(rid) for rid in request_ids), timeout,
                 f"an inference log line of each of the requests {', '.join(request_ids)}")
        return [self.inference_lines(rid) for rid in request_ids]

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if get(self.url + "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"service not ready after {timeout}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        terminate(self.proc, 40)
        kill_session(self.proc)


def start(model: Path, log_dir: Path, wait: bool = True, **env: str) -> Server:
    """``vlfleet serve --model MODEL`` on a free loopback port; ``env`` adds VLFLEET_* settings."""
    port = free_port()
    log_path = log_dir / f"service-{port}.log"
    vlfleet = Path(sys.executable).with_name("vlfleet")
    environ = {**os.environ, **{k: str(v) for k, v in env.items()}}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(vlfleet), "serve", "--model", str(model), "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    server = Server(proc, port, log_path)
    if wait:
        try:
            server.wait_ready()
        except Exception:
            server.stop()
            raise
    return server

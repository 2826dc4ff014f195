"""A steady client load through the load balancer while the fleet changes, for the rollout e2e tests and
`vlfleet staging.scale`: every request made during a rollout must succeed."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from ops.host import client


@dataclass
class Load:
    """Clients looping chat requests (streamed and not) through nginx until stopped, bounded in count and time.

    ``with Load(lb_address) as load: ...`` runs the clients for the block; ``load.log`` holds one record per
    request (``ok``, ``stream``, ``status``, ``first_token_s``, ``seconds``, ``error``), ``load.summary()`` the
    counts (requests, failures, first-token percentiles).
    """

    host: str
    port: int = 80
    clients: int = 2
    max_requests: int = 5000  # per load run, whatever happens
    max_seconds: float = 1200
    pause: float = 0.1  # seconds between two requests of one client
    log: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def one(self, n: int, stream: bool) -> dict:
        # A different prompt each time: the service replays identical deterministic requests from its answer cache.
        body = {"messages": [{"role": "user", "content": f"Say something about fleet number {n}."}], "max_tokens": 8,
                "ignore_eos": True, "stream": stream}
        a = client.chat(f"http://{self.host}:{self.port}", body, timeout=120)
        rec: dict = {"stream": stream, "ok": a.status == 200 and a.error is None, "seconds": a.total_s}
        if a.status is not None:
            rec.update(status=a.status, upstream=a.headers.get("X-Request-Id", ""))
        if a.error:
            rec["error"] = a.error
        elif stream:
            rec["ok"] = rec["ok"] and a.done and a.chunks >= 1
            if a.first_token_s is not None:
                rec["first_token_s"] = a.first_token_s
        else:
            rec["ok"] = rec["ok"] and a.tokens == 8
            rec["first_token_s"] = a.total_s  # whole answer: the first token is in it
        return rec

    def _loop(self, n: int) -> None:
        """One client: requests n, n + clients, n + 2 * clients, ..."""
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline and len(self.log) < self.max_requests:
            self.log.append(self.one(n, stream=n % 2 == 0))
            n += self.clients
            time.sleep(self.pause)

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)

    def summary(self) -> dict:
        return summarize(self.log)


def summarize(log: list[dict]) -> dict:
    """Counts of a load's request records; first-token percentiles over the streamed ones (None without any)."""
    ttfts = sorted(r["first_token_s"] for r in log if r["stream"] and "first_token_s" in r)
    failed = [r for r in log if not r["ok"]]
    return {"requests": len(log), "streamed": sum(r["stream"] for r in log), "failures": len(failed),
            "failed": failed[:5],
            "p50_first_token_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "p95_first_token_s": round(ttfts[int(0.95 * (len(ttfts) - 1))], 3) if ttfts else None}

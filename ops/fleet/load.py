"""A steady client load through the load balancer while the fleet changes: clients looping chat requests (streamed
and not) until stopped, bounded in count and time, with one record per request and a summary (requests, failures,
first-token percentiles).

Used by the rollout e2e tests and by `vlfleet staging.scale`: every request made during a rollout must succeed.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field

CLIENTS = 2
MAX_REQUESTS = 5000  # per load run, whatever happens
PAUSE = 0.1  # seconds between two requests of one client
MAX_SECONDS = 1200


@dataclass
class Load:
    """Clients looping chat requests through nginx until stopped (bounded in count and time).

    ``with Load(lb_address) as load: ...`` runs the clients for the block; ``load.log`` holds one record per
    request (``ok``, ``stream``, ``status``, ``first_token_s``, ``seconds``, ``error``), ``load.summary()`` the
    counts.
    """

    host: str
    port: int = 80
    clients: int = CLIENTS
    max_requests: int = MAX_REQUESTS
    max_seconds: float = MAX_SECONDS
    pause: float = PAUSE
    log: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def one(self, n: int, stream: bool) -> dict:
        # A different prompt each time: the service replays identical deterministic requests from its answer cache.
        body = {"messages": [{"role": "user", "content": f"Say something about fleet number {n}."}], "max_tokens": 8,
                "ignore_eos": True, "stream": stream}
        started = time.monotonic()
        rec: dict = {"stream": stream, "ok": False}
        # A fresh connection per request, like a browser tab: no client keepalive racing nginx's worker reload.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            rec["status"] = resp.status
            if not stream:
                data = json.loads(resp.read())
                rec["ok"] = resp.status == 200 and data["usage"]["completion_tokens"] == 8
                rec["first_token_s"] = time.monotonic() - started  # whole answer: the first token is in it
            else:
                tokens, done = 0, False
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    delta = json.loads(line[6:])["choices"][0]["delta"] if '"choices"' in line else {}
                    if delta.get("content"):
                        tokens += 1
                        rec.setdefault("first_token_s", time.monotonic() - started)
                rec["ok"] = resp.status == 200 and done and tokens >= 1
            rec["upstream"] = resp.getheader("X-Request-Id", "")
        except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        rec["seconds"] = time.monotonic() - started
        return rec

    def _loop(self, index: int) -> None:
        deadline = time.monotonic() + self.max_seconds
        n = index
        while not self._stop.is_set() and time.monotonic() < deadline and len(self.log) < self.max_requests:
            self.log.append(self.one(n, stream=n % 2 == 0))
            n += self.clients
            time.sleep(self.pause)

    def __enter__(self) -> Load:
        for i in range(self.clients):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)

    def summary(self) -> dict:
        return summarize(self.log)


def summarize(log: list[dict]) -> dict:
    """Counts of a load's request records: requests, streamed, failures (the first five in ``failed``), and the
    p50/p95 first-token time of the streamed ones (None without any)."""
    ttfts = sorted(r["first_token_s"] for r in log if r["stream"] and "first_token_s" in r)
    failed = [r for r in log if not r["ok"]]
    return {"requests": len(log), "streamed": sum(r["stream"] for r in log), "failures": len(failed),
            "failed": failed[:5],
            "p50_first_token_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "p95_first_token_s": round(ttfts[int(0.95 * (len(ttfts) - 1))], 3) if ttfts else None}

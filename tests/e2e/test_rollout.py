"""Rolling changes on a staging fleet (3 service hosts behind the lb's nginx) while clients keep chatting.

A bounded stream of chat requests (streaming and not) goes through nginx during each change; every one must
succeed. A good release reaches every host; a release whose service cannot start is rolled back on the canary and
goes no further; rollback --to brings the fleet back to where it started.

VLFLEET_ROLLOUT_INVENTORY=PATH runs these against an already converged fleet instead of the `staging_fleet` one.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ops import fleet as ops_fleet
from ops.fleet import Fleet, Outcome, Release, Timeouts, load_inventory
from tests.e2e.site_vars import converge

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

CLIENTS = 2
MAX_REQUESTS = 5000  # per load run, whatever happens
PAUSE = 0.1  # seconds between two requests of one client
MAX_SECONDS = 1200


@dataclass
class Load:
    """Clients looping chat requests through nginx until stopped (bounded in count and time)."""

    host: str
    port: int = 80
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
        deadline = time.monotonic() + MAX_SECONDS
        n = index
        while not self._stop.is_set() and time.monotonic() < deadline and len(self.log) < MAX_REQUESTS:
            self.log.append(self.one(n, stream=n % 2 == 0))
            n += CLIENTS
            time.sleep(PAUSE)

    def __enter__(self) -> Load:
        for i in range(CLIENTS):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)

    def summary(self) -> dict:
        ttfts = sorted(r["first_token_s"] for r in self.log if r["stream"] and "first_token_s" in r)
        failed = [r for r in self.log if not r["ok"]]
        return {"requests": len(self.log), "streamed": sum(r["stream"] for r in self.log), "failures": len(failed),
                "failed": failed[:5],
                "p50_first_token_s": round(statistics.median(ttfts), 3) if ttfts else None,
                "p95_first_token_s": round(ttfts[int(0.95 * (len(ttfts) - 1))], 3) if ttfts else None}


@pytest.fixture(scope="module")
def inventory(request, tiny_model: Path) -> Path:
    """A fleet whose vlm hosts all serve: the session's converged e2e fleet, or VLFLEET_ROLLOUT_INVENTORY's."""
    given = os.environ.get("VLFLEET_ROLLOUT_INVENTORY")
    if not given:
        return request.getfixturevalue("converged_inventory")
    converge(Path(given), tiny_model)
    return Path(given)


def _fleet(path: Path) -> Fleet:
    return Fleet(load_inventory(path), timeouts=Timeouts(drain=60, ready=600), echo=print)


def _lb_address(path: Path) -> str:
    return load_inventory(path).group("lb")[0].address


def _releases(path: Path) -> dict[str, tuple[str | None, bool]]:
    with _fleet(path) as f:
        return {r["host"]: (r.get("serving"), bool(r.get("ready"))) for r in ops_fleet.status(f)}


@pytest.fixture(scope="module")
def start(inventory) -> dict[str, tuple[str | None, bool]]:
    """What every host served before these tests."""
    return _releases(inventory)


def _report(name: str, data: dict) -> None:
    from ops.paths import cache_root

    out = cache_root() / "reports"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    print(f"\n[{name}] {json.dumps(data)}")


def test_rollout_under_load_reaches_every_host_with_no_failed_request(inventory, start):
    new = f"e2e-{int(time.time())}"
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        time.sleep(3)  # traffic flowing before the first drain
        report = f and ops_fleet.rollout(f, Release(new), batch="1,25%,50%")
        time.sleep(2)
    print("\n" + report.table())
    summary = load.summary()
    _report("rollout-e2e", {"release": new, "hosts": len(report.results), "rollout_s": report.seconds, **summary})
    assert report.ok, report.summary()
    assert summary["failures"] == 0, summary["failed"]
    assert summary["requests"] >= 10 and summary["streamed"] >= 5
    after = _releases(inventory)
    assert after == {h: (new, True) for h in start}, after


def test_release_that_cannot_start_is_rolled_back_on_the_canary_only(inventory, start):
    before = _releases(inventory)
    bad = f"e2e-bad-{int(time.time())}"
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        report = ops_fleet.rollout(f, Release(bad, env={"VLFLEET_QUEUE_SIZE": "0"}), batch="1,25%,50%")
        time.sleep(2)
    print("\n" + report.table())
    summary = load.summary()
    _report("rollout-bad-e2e", {"release": bad, "rollout_s": report.seconds, **summary})
    canary, *rest = report.results
    assert canary.outcome is Outcome.ROLLED_BACK, report.table()
    assert "VLFLEET_QUEUE_SIZE" in canary.message  # the reason reaches the operator
    assert [r.outcome for r in rest] == [Outcome.SKIPPED] * len(rest) and report.stopped
    assert _releases(inventory) == before  # canary back, the others never changed
    assert summary["failures"] == 0, summary["failed"]


def test_rollback_to_the_first_release_and_status_shows_the_fleet(inventory, start):
    original = {release for release, _ready in start.values()}
    assert len(original) == 1, f"hosts started on different releases: {start}"
    target = original.pop()
    with _fleet(inventory) as f, Load(_lb_address(inventory)) as load:
        report = ops_fleet.rollback(f, to=target, batch="1,50%")
        rows = ops_fleet.status(f)
    summary = load.summary()
    print("\n" + report.table() + "\n" + ops_fleet.status_table(rows))
    _report("rollback-e2e", {"release": target, "rollback_s": report.seconds, **summary})
    assert report.ok, report.summary()
    assert summary["failures"] == 0, summary["failed"]
    assert {r["host"]: (r["serving"], r["ready"]) for r in rows} == start
    for r in rows:
        assert r["rss_bytes"] and r["rss_bytes"] > 50 * 2**20, r
        assert r["uptime_s"] is not None and r["queue_depth"] is not None, r
    # hosts that served traffic since their restart have a first-token p50 from the histogram
    assert any(r["ttft_p50_s"] for r in rows), rows

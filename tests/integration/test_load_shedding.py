"""Under memory pressure the service sheds new work (503), finishes what it admitted, and recovers by itself."""

from __future__ import annotations

import io
import math
import threading
import time

import numpy as np
import requests
from PIL import Image

from tests import servers
from tests.integration.conftest import image_message

CHAT = "/v1/chat/completions"


def noise_png(width: int, height: int) -> bytes:
    """Incompressible pixels: a big body that the server holds in memory while it answers."""
    pixels = np.random.default_rng(1).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG", compress_level=0)
    return buf.getvalue()


# Only the process signal is under test: host memory is moved by whatever else runs on this machine.
SETTINGS = {"VLFLEET_MAX_TOKENS": "4096", "VLFLEET_ANSWER_CACHE_MB": "0", "VLFLEET_SYSTEM_MEMORY_HIGH_WATER": "1.0"}


def idle_rss_mb(tiny_model, tmp_path) -> float:
    """RSS of an idle, warmed-up service with the same settings: the base the limit is sized from."""
    twin = servers.start(tiny_model, tmp_path, **SETTINGS)
    try:
        time.sleep(1.0)  # let the guard sample once more after warm-up
        return twin.metric("vlfleet_process_rss_bytes") / 2**20
    finally:
        twin.stop()


def test_burst_sheds_then_recovers(tiny_model, tmp_path):
    # Each in-flight burst request holds ~50 MiB (its body, parsed); three fit under the high mark, the
    # fourth's image decoding crosses it, and the three keep memory above the low mark while they run.
    idle_mb = idle_rss_mb(tiny_model, tmp_path)
    limit_mb = math.ceil((idle_mb + 180) / 0.9)
    server = servers.start(tiny_model, tmp_path, VLFLEET_MEMORY_LIMIT_MB=str(limit_mb),
                           VLFLEET_MEMORY_HIGH_WATER="0.9", VLFLEET_MEMORY_LOW_WATER="0.75", **SETTINGS)
    try:
        assert servers.get(server.url + "/readyz")[0] == 200, "idle service already over the mark"
        big = image_message("Describe.", noise_png(2000, 1500))
        results: list[requests.Response] = []

        def burst_request():
            body = {"messages": [big], "max_tokens": 4096, "ignore_eos": True}
            results.append(requests.post(server.url + CHAT, json=body, timeout=300))

        first_tokens = server.metric("vlfleet_time_to_first_token_seconds_count")

        def settled() -> int:
            """Burst requests admitted (generating or done: a first token; or queued) or already refused."""
            started = server.metric("vlfleet_time_to_first_token_seconds_count") - first_tokens
            return int(started + server.metric("vlfleet_queue_depth")) + sum(r.status_code != 200 for r in results)

        burst = [threading.Thread(target=burst_request) for _ in range(6)]
        for n, t in enumerate(burst, 1):
            t.start()
            # Each is decoded and admitted (or refused) before the next arrives: seen, not assumed after a sleep.
            servers.wait_for(lambda n=n: settled() >= n, 60, f"burst request {n} to be admitted or refused")

        def readyz() -> int:
            return servers.get(server.url + "/readyz")[0]

        shed_after = servers.wait_for(lambda: readyz() == 503, 30, "/readyz to report shedding")
        status, ready = servers.get(server.url + "/readyz")
        assert status == 503 and "shedding load: memory" in ready.get("reason", "")
        refused = requests.post(server.url + CHAT, json={"messages": [image_message()], "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) > 0
        assert "memory" in refused.json()["error"]["message"]

        for t in burst:
            t.join(timeout=300)
        admitted = [r for r in results if r.status_code == 200]
        assert admitted, [(r.status_code, r.text[:200]) for r in results]
        for r in admitted:  # what was admitted before shedding ran to the end
            assert r.json()["usage"]["completion_tokens"] == 4096
        for r in results:
            assert r.status_code in (200, 503), r.text
        recovered_after = servers.wait_for(lambda: readyz() == 200, 90, "recovery")
        assert server.metric("vlfleet_shed_requests_total") >= 1
        ok = requests.post(server.url + CHAT, json={"messages": [image_message()], "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200
        print(f"idle {idle_mb:.0f} MiB, limit {limit_mb} MiB; shedding seen {shed_after:.1f}s after the last burst "
              f"request; recovered {recovered_after:.1f}s after the burst ended; "
              f"{len(admitted)}/{len(results)} burst requests admitted")
    finally:
        server.stop()
    log = server.log()
    assert '"msg": "memory pressure: shedding new requests"' in log
    assert '"msg": "memory pressure relieved: admitting requests again"' in log

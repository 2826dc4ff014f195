"""N clients at once, each with its own image: aggregate output tokens/s, first-token percentiles, errors."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ops.bench import workload
from ops.bench.stats import percentile


def aggregate(samples: list[workload.Sample], errors: list[str], wall_s: float, clients: int) -> dict:
    """One concurrency level's numbers from its answers and the wall time from the common start to the last end."""
    firsts = [s.first_token_s for s in samples]
    tokens = sum(s.tokens for s in samples)
    return {
        "clients": clients,
        "requests": len(samples) + len(errors),
        "errors": len(errors),
        "error_messages": sorted(set(errors))[:5],
        "output_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "first_token_p50_s": percentile(firsts, 50) if firsts else None,
        "first_token_p95_s": percentile(firsts, 95) if firsts else None,
        "ms_per_token_p50": percentile([s.ms_per_token for s in samples], 50) if samples else None,
    }


def level(url: str, clients: int, tokens: int, rounds: int = 1, seed_base: int = 1000,
          width: int = 416, height: int = 277, timeout: float = 600) -> dict:
    """``clients`` threads start together (a barrier), each sends ``rounds`` requests back to back."""
    images = [workload.test_image(width, height, seed=seed_base + i) for i in range(clients * rounds)]
    barrier = threading.Barrier(clients, timeout=60)
    samples: list[workload.Sample] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        barrier.wait()
        for r in range(rounds):
            try:
                sample = workload.over_http(url, images[index * rounds + r], tokens, timeout=timeout)
            except Exception as e:  # an error is a result here, counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:200])
                continue
            with lock:
                samples.append(sample)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return aggregate(samples, errors, time.perf_counter() - started, clients)

"""Admission by estimated wait: how long the work ahead of a new request will take, learned from finished jobs.

A request that would wait longer than VLFLEET_QUEUE_TIMEOUT only to get a 503 is better refused at once with a
429 and an honest Retry-After. The estimate is pessimistic per job (every queued job is assumed to use all of its
max_tokens), from two rates the engine measures on every answer: prefill (start to first token) and seconds
per generated token after it. It fits engines that run one job at a time; a batching engine does not wait that way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from service.engine.conversation import Timings

# Exponentially weighted averages: recent jobs weigh most, so the estimate follows a change of load or prompt mix
# within a few jobs, one outlier (a huge image) moves it only part of the way, and no window of samples is kept.
WEIGHT = 0.3


class WaitEstimator:
    """Thread-safe: the inference thread calls ``learn``, HTTP threads call ``wait``."""

    def __init__(self, weight: float = WEIGHT):
        self.weight = weight
        self._lock = threading.Lock()
        self._prefill: float | None = None
        # Seconds per token is the ratio of two averages (decode seconds, decoded tokens), not an average of ratios:
        # a job counts in proportion to its tokens, so a 2-token answer's one noisy interval barely moves the rate.
        self._decode_s: float | None = None
        self._decode_tokens: float | None = None

    def learn(self, timings: Timings) -> None:
        """Fold one finished job's timings in (a job stopped before its first token measured nothing)."""
        if timings.first_token_s is None:
            return
        intervals = timings.completion_tokens - 1  # decode steps after the first token
        with self._lock:
            self._prefill = self._average(self._prefill, timings.first_token_s)
            if intervals > 0:
                self._decode_s = self._average(self._decode_s, timings.total_s - timings.first_token_s)
                self._decode_tokens = self._average(self._decode_tokens, intervals)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)

    def job_seconds(self, max_tokens: int) -> float | None:
        """The time a job asking for ``max_tokens`` takes at most; None until a job has been timed."""
        rates = self._rates()
        return None if rates is None else rates[0] + max_tokens * rates[1]

    def wait(self, running: tuple[int, float] | None, queued: Iterable[int]) -> float | None:
        """Seconds before a new request would start: the rest of the running job (``(max_tokens, elapsed s)``),
        then every queued job (their max_tokens); None until a job has been timed (then nothing is refused)."""
        rates = self._rates()
        if rates is None:
            return None
        prefill, per_token = rates
        total = sum(prefill + n * per_token for n in queued)
        if running is not None:
            max_tokens, elapsed = running
            total += max(0.0, prefill + max_tokens * per_token - elapsed)
        return total

    def _rates(self) -> tuple[float, float] | None:
        """(prefill s, s per token), read together; None until both were measured."""
        with self._lock:
            prefill, decode_s, tokens = self._prefill, self._decode_s, self._decode_tokens
        return None if prefill is None or decode_s is None or not tokens else (prefill, decode_s / tokens)

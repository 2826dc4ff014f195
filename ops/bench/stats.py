"""Order statistics for small benchmark samples (no numpy: these are a handful of numbers), and ratios of them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks, as numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0-100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def best_rate(fn: Callable[[], object], passes: int, work: float) -> float:
    """``work`` (bytes, FLOPs) per second of the fastest of ``passes`` calls of ``fn``: the machine's limit, not its
    average, since anything else running only ever slows a pass down."""
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return work / best


TOLERANCE = 0.05  # "within 5 %": HTTP+SSE vs in-process, either way


def within(value: float, center: float, tolerance: float) -> bool:
    """|value - center| <= tolerance, two-sided (a hair of float slack: 1.05 is within 5 % of 1)."""
    return abs(value - center) <= tolerance + 1e-12


def compare(ratio: float, name: str, other: str, tolerance: float = TOLERANCE) -> dict:
    """Judge ``ratio`` = ``name``'s time / ``other``'s time both ways: within when |ratio - 1| <= ``tolerance``;
    either way, which of the two is slower and by how much (in percent of the faster one's time)."""
    if ratio <= 0:
        raise ValueError(f"a ratio of times must be positive, got {ratio}")
    slower, by = (name, ratio - 1) if ratio >= 1 else (other, 1 / ratio - 1)
    ok = within(ratio, 1.0, tolerance)
    if ratio == 1:
        text = f"{name} and {other} take the same time"
    else:
        faster = other if slower == name else name
        text = f"{slower} {100 * by:.1f} % slower than {faster}"
    text += f" ({'within' if ok else 'not within'} {100 * tolerance:g} %)"
    return {"ratio": ratio, "within": ok, "slower": None if ratio == 1 else slower,
            "slower_by_percent": 100 * by, "summary": text}


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median of a handful of times: how far one setting's own runs wandered; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / percentile(values, 50)


LEVER_METRICS = ("first_token_s", "ms_per_token")  # what a lever is judged on against the defaults


def lever_defaults(levers: list[dict]) -> dict | None:
    """The service defaults a lever is compared with: the faster of the baseline rows, per metric.

    The levers section measures the defaults first and again last, so a machine that drifts during the section
    cannot make a lever look better than the defaults it was really measured beside."""
    bases = [lv for lv in levers if lv["name"] == "baseline"]
    if not bases:
        return None
    return {key: min(b[key] for b in bases) for key in LEVER_METRICS}

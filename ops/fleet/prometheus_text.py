"""Read the few things `vlfleet status` needs from a Prometheus text exposition: info labels, histogram quantiles."""

from __future__ import annotations

import contextlib
import math
import re

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group("name") == name:
            pairs = _LABEL.findall(m.group("labels") or "")
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in pairs}
            with contextlib.suppress(ValueError):  # a value that is not a number: no sample
                out.append((labels, float(m.group("value"))))
    return out


def info_labels(text: str, name: str) -> dict[str, str]:
    """Labels of an Info metric (`<name>_info{...} 1`), or {}."""
    found = samples(text, f"{name}_info")
    return found[0][0] if found else {}


def histogram_quantile(text: str, name: str, q: float) -> float | None:
    """Quantile ``q`` of histogram ``name`` over its whole life, interpolated within a bucket like PromQL's
    histogram_quantile; None when it has no observations. Above the largest finite bucket: that bucket's bound."""
    buckets = sorted((float(labels["le"]), count) for labels, count in samples(text, f"{name}_bucket")
                     if "le" in labels)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound

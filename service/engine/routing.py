"""What the load balancer and a host tell each other about a request (docs/operations.md, "Routing").

nginx sends a conversation's requests to the host that holds it, with ``X-Vlfleet-Max-Wait``: the seconds of
queued work this host may make the request wait. Past that the host refuses at once (429) and nginx sends the
request to the least busy host instead, where it pays one cold first token rather than the wait. Every answer
names the host that served it and what it reused there, so a client, a log or a benchmark can tell whether
routing kept the conversation where its caches are.
"""

from __future__ import annotations

import math
import socket
from typing import TYPE_CHECKING

from service.engine.errors import APIError

if TYPE_CHECKING:  # the engine imports this module for HOST
    from service.engine.events import Started

MAX_WAIT_HEADER = "X-Vlfleet-Max-Wait"
HOST = socket.gethostname()


def max_wait(headers) -> float | None:
    """The wait bound the load balancer set for this request (seconds), or None."""
    raw = headers.get(MAX_WAIT_HEADER, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise APIError(f"header {MAX_WAIT_HEADER} must be a number of seconds >= 0, got {raw[:40]!r}", 400,
                       code="invalid_header")
    return value


def reuse_headers(started: Started | None, queued_s: float) -> dict[str, str]:
    """What the host reused for this answer (the answer cache, a cached conversation, its encoded images), and how
    long the request waited in its queue (what a client's first token owes the host's load, not its caches)."""
    replayed = started is not None and started.cache == "hit"  # never queued
    wait = {"X-Queue-Wait": f"{0.0 if replayed else max(0.0, queued_s):.3f}"}
    if started is None:
        return {"X-Session-Reused": "0", "X-Cache": "miss", "X-Image-Cache": "none", **wait}
    return {"X-Session-Reused": "1" if started.reused_session else "0", "X-Cache": started.cache,
            "X-Image-Cache": image_cache(started.images, started.images_cached), **wait}


def image_cache(images: int, cached: int) -> str:
    """``none`` (no image), ``hit`` (every image already encoded here), ``miss`` or ``partial``."""
    if images == 0:
        return "none"
    return "hit" if cached >= images else "miss" if cached == 0 else "partial"

"""Server-Sent Events framing."""

from __future__ import annotations

import json


def event(data, name: str | None = None) -> str:
    """One SSE event; ``data`` is sent as JSON unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {name}\n" if name else ""
    return head + "".join(f"data: {line}\n" for line in payload.split("\n")) + "\n"


# A comment line: ignored by clients, but writing it tells us whether the client is still there.
KEEPALIVE = ": keep-alive\n\n"

HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event through as it is written
}

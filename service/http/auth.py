"""Optional API keys: bearer tokens read from a root-owned file, compared in constant time, never logged."""

from __future__ import annotations

import hmac
from pathlib import Path

from service.engine.errors import APIError

OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def load_keys(path: Path | None) -> tuple[bytes, ...]:
    if path is None:
        return ()
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"VLFLEET_API_KEYS_FILE={path} cannot be read: {e.strerror}") from None
    keys = tuple(line.strip().encode() for line in lines if line.strip() and not line.startswith("#"))
    if not keys:
        raise ValueError(f"VLFLEET_API_KEYS_FILE={path} holds no keys; add one per line or unset the variable")
    return keys


def check(keys: tuple[bytes, ...], path: str, authorization: str | None) -> None:
    """Raise 401 unless ``authorization`` carries one of ``keys`` (no keys configured = open)."""
    if not keys or path in OPEN_PATHS:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError("missing API key: send 'Authorization: Bearer <key>'", 401, code="missing_api_key")
    presented = token.strip().encode()
    # Compare against every key so timing does not reveal which (or whether an early one) matched.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    if not matched:
        raise APIError("invalid API key", 401, code="invalid_api_key")

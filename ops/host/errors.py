"""The error a host step reports, and how a step reads its arguments."""

from __future__ import annotations


class HostError(RuntimeError):
    """A step cannot be done; the message says why (it becomes the host's result line)."""


def flag(args: dict, name: str, default: bool = False) -> bool:
    """A boolean argument; "false"/"no"/"0" (as a template may pass them) are false."""
    value = args.get(name, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "no", "0", "none")
    return bool(value)

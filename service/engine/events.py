"""What a job tells the HTTP thread reading it, one small immutable value per event.

Types instead of ``(kind, dict)`` tuples: a reader matches on the class, and a misspelt kind or field is an
error at the spot instead of a silently skipped event. A job's events are ``Started``, then ``Token``s, then
one ``Done``; or a ``Failed`` at any point. ``KEEPALIVE`` ticks while nothing happens, so a reader can write
to its client and notice that it went away.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.engine.conversation import Timings
from service.engine.errors import APIError


@dataclass(frozen=True)
class Started:
    """Generation began (or a cached answer is about to be replayed)."""

    reused_session: bool  # earlier turns came from the session store
    images: int  # images in the whole conversation
    cache: str  # answer cache: "hit" (replayed) or "miss"
    images_cached: int = 0  # of ``images``, those already encoded on this host (the vision encoder skips them)


@dataclass(frozen=True)
class Token:
    """The next piece of the answer's text, and the logprob entries of the tokens that made it (service.engine.logprobs;
    only when the request asked for logprobs)."""

    text: str
    logprobs: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Done:
    """The answer ended; the last event of a job that did not fail."""

    finish_reason: str  # "stop", "length" or "cancelled"
    text: str  # the whole answer
    timings: Timings
    session: str | None  # key to continue the conversation by; None when cancelled or replayed


@dataclass(frozen=True)
class Failed:
    """The job failed (queue timeout, generation error); the last event."""

    error: APIError


@dataclass(frozen=True)
class Keepalive:
    """Nothing happened for a while; not an event of the job itself."""


KEEPALIVE = Keepalive()

Event = Started | Token | Done | Failed | Keepalive
FINAL = (Done, Failed)  # a job emits nothing after one of these

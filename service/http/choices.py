"""OpenAI's ``n``: a request for n choices is n jobs of the same conversation, one per choice.

Each job is an ordinary answer to the engine: the batching engine runs them side by side (its scheduler's prefix
cache shares the prompt's KV blocks between them), the others one after another (the direct engine's KV state
still holds the prompt for the next choice; llama-server's slot re-uses it by cache_prompt). The answer cache keys
each choice as the single answer it is. With a seed, choice i samples with seed + i: n equal seeds would make n
equal answers; at temperature 0 every choice is the greedy answer.

Choices are read in order: a streamed answer sends choice 0's chunks, then choice 1's, each with its index, and one
usage chunk after the last.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

from service.engine import Done, Event, Job
from service.engine.conversation import Sampling, Timings
from service.http.streaming import JobStream, sse_body

SEED_SPACE = 2**63  # the API's seed bound


def sampling_of(sampling: Sampling, index: int) -> Sampling:
    if sampling.seed is None or index == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index) % SEED_SPACE)


def submit(engine, parsed, request_id: str, max_wait: float | None) -> list[Job]:
    """One job per choice, or none: a choice the engine refuses (429, 503) cancels those already queued."""
    jobs: list[Job] = []
    try:
        for i in range(parsed.n):
            rid = request_id if i == 0 else f"{request_id}.{i}"
            jobs.append(engine.submit(parsed.conversation, sampling_of(parsed.sampling, i), rid, max_wait))
    except BaseException:
        cancel(jobs)
        raise
    return jobs


def cancel(jobs: list[Job]) -> None:
    for job in jobs:
        job.cancel()


def wait_started(streams: list[JobStream]) -> dict[str, str]:
    """The first choice's start (its headers); the others start in their turn."""
    try:
        return streams[0].wait_started()
    except BaseException:
        cancel([s.job for s in streams])
        raise


def collect(streams: list[JobStream]) -> list[Done]:
    try:
        return [s.collect() for s in streams]
    finally:
        cancel([s.job for s in streams])


def usage(timings: list[Timings]) -> dict:
    """The prompt once (as OpenAI counts it), the completion tokens of every choice."""
    prompt = timings[0].prompt_tokens if timings else 0
    completion = sum(t.completion_tokens for t in timings)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse_choices(streams: list[JobStream], render: Callable[[int, Event], str | None], keepalive: str) -> Iterator[str]:
    """SSE text for every event of every choice in turn (``render(index, event)``); nothing after a Failed. A client
    that goes away cancels every choice, the ones not read yet included."""
    try:
        for i, stream in enumerate(streams):
            yield from sse_body(stream, functools.partial(render, i), keepalive)
            if stream.failed:
                return
    finally:
        cancel([s.job for s in streams])

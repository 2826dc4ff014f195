"""A job's events and how the HTTP side reads them, without a model: the order, the queue timeout, keep-alives."""

from __future__ import annotations

import time

import pytest

from service.engine import KEEPALIVE, Done, Failed, Job, Started, Token
from service.engine.answer_cache import CachedAnswer
from service.engine.conversation import Conversation, Sampling, Turn
from service.engine.errors import Overloaded
from service.engine.job import replay
from service.http.streaming import JobStream, sse_body

CONV = Conversation((Turn("user", "hello"),))


def test_replay_streams_a_cached_answer_as_a_generation_would():
    answer = CachedAnswer(("Hel", "lo"), "stop", prompt_tokens=7, completion_tokens=2)
    events = list(replay(CONV, Sampling(max_tokens=8), "r1", answer).events(queue_timeout=60))
    assert events[:3] == [Started(reused_session=False, images=0, cache="hit"), Token("Hel"), Token("lo")]
    done = events[3]
    assert isinstance(done, Done) and len(events) == 4
    assert (done.finish_reason, done.text, done.session) == ("stop", "Hello", None)
    assert (done.timings.prompt_tokens, done.timings.completion_tokens) == (7, 2)


def test_a_job_that_never_starts_fails_with_a_503_once_the_queue_timeout_passed():
    job = Job(CONV, Sampling(max_tokens=8), "r2")
    started = time.monotonic()
    events = list(job.events(queue_timeout=0.2, keepalive=0.01))
    assert time.monotonic() - started >= 0.2
    # Keep-alives while it waits (how many depends on scheduling: none on a loaded machine), then the 503.
    assert all(e is KEEPALIVE for e in events[:-1])
    failed = events[-1]
    assert isinstance(failed, Failed) and isinstance(failed.error, Overloaded) and failed.error.status == 503
    assert "VLFLEET_QUEUE_TIMEOUT" in failed.error.message


def test_a_cancelled_job_is_not_picked_up():
    job = Job(CONV, Sampling(max_tokens=8), "r3")
    job.cancel()
    assert job.cancelled.is_set() and not job._transition("queued", "running")


def test_job_stream_reports_the_start_and_collects_the_answer():
    answer = CachedAnswer(("a", "b"), "length", prompt_tokens=1, completion_tokens=2)
    stream = JobStream(replay(CONV, Sampling(max_tokens=2), "r4", answer), queue_timeout=60)
    headers = stream.wait_started()
    assert headers.pop("X-Queue-Wait") == "0.000"  # a replay never queues
    assert headers == {"X-Session-Reused": "0", "X-Cache": "hit", "X-Image-Cache": "none"}  # a text question
    done = stream.collect()
    assert (done.text, done.finish_reason) == ("ab", "length")
    assert stream.first_token_at is not None


def test_job_stream_raises_the_error_a_job_fails_with():
    job = Job(CONV, Sampling(max_tokens=8), "r5")
    job.put(Failed(Overloaded("too slow", 503, retry_after=5)))
    with pytest.raises(Overloaded, match="too slow"):
        JobStream(job, queue_timeout=60).wait_started()


def test_sse_body_renders_events_and_writes_keepalives():
    job = Job(CONV, Sampling(max_tokens=8), "r6")
    job.put(Started(reused_session=True, images=1, cache="miss"))
    stream = JobStream(job, queue_timeout=60)
    headers = stream.wait_started()
    assert float(headers.pop("X-Queue-Wait")) >= 0
    assert headers == {"X-Session-Reused": "1", "X-Cache": "miss", "X-Image-Cache": "miss"}
    stream._events = iter([KEEPALIVE, Token("x"), Failed(Overloaded("gone", 503, retry_after=1))])
    rendered = list(sse_body(stream, lambda e: type(e).__name__, ": ka\n\n"))
    assert rendered == ["Started", ": ka\n\n", "Token", "Failed"]
    assert job.cancelled.is_set()  # the stream ended: the job is cancelled (a no-op once finished)

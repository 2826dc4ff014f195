"""The wait estimator behind admission by estimated wait (service.engine.admission), without a model."""

from __future__ import annotations

import threading

import pytest

from service.engine.admission import WaitEstimator
from service.engine.conversation import Timings


def timed(prefill: float, per_token: float, tokens: int) -> Timings:
    """A finished job's timings: first token after ``prefill`` s, then ``per_token`` s for each further token."""
    return Timings(first_token_s=prefill, total_s=prefill + per_token * (tokens - 1), completion_tokens=tokens)


def test_no_estimate_before_a_job_was_timed():
    est = WaitEstimator()
    assert est.wait(None, [128, 128]) is None
    assert est.wait((128, 0.0), []) is None
    est.learn(Timings(first_token_s=None, total_s=3.0))  # cancelled before its first token: measured nothing
    assert est.wait(None, [128]) is None
    est.learn(timed(0.5, 0.01, 1))  # one token: a prefill, but no decode rate yet
    assert est.wait(None, [128]) is None
    assert est.job_seconds(128) is None


def test_queued_jobs_cost_prefill_plus_their_max_tokens():
    est = WaitEstimator()
    est.learn(timed(0.5, 0.01, 101))
    assert est.job_seconds(100) == pytest.approx(1.5)
    assert est.wait(None, []) == 0.0  # idle: no wait
    assert est.wait(None, [10, 20]) == pytest.approx(2 * 0.5 + 30 * 0.01)


def test_the_running_job_counts_with_what_is_left_of_it():
    est = WaitEstimator()
    est.learn(timed(1.0, 0.01, 101))
    # The running job asked for 400 tokens (estimate 5 s) and has run 2 s: 3 s left, then one queued 100-token job.
    assert est.wait((400, 2.0), [100]) == pytest.approx(3.0 + 2.0)
    # A running job past its estimate is about to end, not owed time back.
    assert est.wait((400, 60.0), [100]) == pytest.approx(2.0)


def test_recent_jobs_weigh_most():
    est = WaitEstimator(weight=0.25)
    est.learn(timed(1.0, 0.010, 11))
    est.learn(timed(3.0, 0.050, 11))  # a slower job moves the estimate a quarter of the way
    assert est.job_seconds(0) == pytest.approx(1.5)
    assert est.job_seconds(100) == pytest.approx(1.5 + 100 * 0.020)
    for _ in range(30):  # a lasting change of speed is followed within a few dozen jobs
        est.learn(timed(3.0, 0.050, 11))
    assert est.job_seconds(100) == pytest.approx(3.0 + 100 * 0.050, rel=0.01)


def test_a_short_answer_counts_by_its_tokens():
    est = WaitEstimator(weight=0.5)
    est.learn(timed(0.1, 0.002, 1001))  # 1000 decode steps at 2 ms
    est.learn(timed(0.1, 0.020, 2))  # one step, ten times slower: scheduling noise more than a rate
    # The rate is the average decode time over the average decode steps: (1.0 + 0.01) s / 500.5 steps, not the
    # 11 ms an average of the two rates would say.
    assert est.job_seconds(1000) - est.job_seconds(0) == pytest.approx(1000 * 1.01 / 500.5)


def test_a_cancelled_job_still_teaches_what_it_measured():
    est = WaitEstimator()
    est.learn(timed(0.2, 0.004, 40))  # stopped after 40 of its max_tokens: its rates are real
    assert est.job_seconds(1000) == pytest.approx(0.2 + 4.0)


def test_learning_and_estimating_from_several_threads():
    est = WaitEstimator()
    est.learn(timed(1.0, 0.01, 11))
    errors: list[BaseException] = []

    def read():
        try:
            for _ in range(2000):
                wait = est.wait((50, 0.1), [10, 10])
                assert wait is not None and wait > 0
        except BaseException as e:  # an assertion in a thread: reported by the main thread
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for n in range(2000):
        est.learn(timed(1.0 + n % 3, 0.01, 11))
    for t in readers:
        t.join()
    assert not errors


def test_a_job_that_has_sent_its_answer_is_no_work_ahead():
    """The inference thread lets go of a job just after its Done: a follow-up asked at once must not be refused (or
    sent to another host by the load balancer's wait bound) for the answer it just got."""
    import queue
    import time
    import types

    from service.engine.base import Engine
    from service.engine.conversation import Conversation, Sampling, Turn
    from service.engine.job import FINISHED, RUNNING, Job

    est = WaitEstimator()
    est.learn(timed(2.0, 0.5, 8))  # a slow host: an 8-token answer takes 5.5 s
    job = Job(Conversation((Turn("user", "hi"),)), Sampling(max_tokens=64), "r1")
    job._transition("queued", RUNNING)
    job.started_at = time.monotonic()  # just started: its whole estimate is ahead
    engine = types.SimpleNamespace(admission=est, running=job, _queue=queue.Queue())
    assert Engine.estimated_wait(engine) > 10  # still generating: its remaining tokens are ahead
    job._transition(RUNNING, FINISHED)
    assert Engine.estimated_wait(engine) == est.wait(None, [])  # answered: nothing ahead

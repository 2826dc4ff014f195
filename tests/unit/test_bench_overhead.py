"""bench.service's judgement (two-sided), its in-process side's request, and the image size the model is fed."""

from __future__ import annotations

import pytest

from ops.bench import server, workload
from ops.bench.bench_md import render
from ops.bench.service_overhead import comparison, request_body
from ops.bench.stats import compare


@pytest.mark.parametrize(("ratio", "within", "slower", "by"), [
    (1.0, True, None, 0.0),
    (1.03, True, "HTTP+SSE", 3.0),
    (1.05, True, "HTTP+SSE", 5.0),
    (1.0501, False, "HTTP+SSE", 5.01),
    (0.96, True, "in-process", 100 * (1 / 0.96 - 1)),
    (0.745, False, "in-process", 100 * (1 / 0.745 - 1)),  # bench-service.json of run 3: not a fast service
])
def test_compare_is_two_sided_and_names_the_slower_side(ratio, within, slower, by):
    got = compare(ratio, "HTTP+SSE", "in-process")
    assert got["ratio"] == ratio
    assert got["within"] is within
    assert got["slower"] == slower
    assert got["slower_by_percent"] == pytest.approx(by)


def test_compare_says_it_in_words():
    assert compare(0.745, "HTTP+SSE", "in-process")["summary"] == \
        "in-process 34.2 % slower than HTTP+SSE (not within 5 %)"
    assert compare(1.02, "HTTP+SSE", "in-process")["summary"] == "HTTP+SSE 2.0 % slower than in-process (within 5 %)"
    with pytest.raises(ValueError, match="positive"):
        compare(0.0, "a", "b")


def test_overhead_result_needs_both_metrics_within_either_way():
    local = {"first_token_s": 1.0, "ms_per_token": 100.0}
    assert comparison(local, {"first_token_s": 1.02, "ms_per_token": 98.0})["within_5_percent"] is True
    slow_local = comparison(local, {"first_token_s": 1.0, "ms_per_token": 74.5})
    assert slow_local["within_5_percent"] is False  # one-sided (ratio <= 1.05) called this met
    assert slow_local["ms_per_token_ratio"] == pytest.approx(0.745)
    assert slow_local["comparison"]["ms_per_token"]["slower"] == "in-process"
    assert slow_local["comparison"]["first_token_s"]["within"] is True
    md = render({"overhead": {"in_process": local, "http_sse": {"first_token_s": 1.0, "ms_per_token": 74.5},
                              **slow_local}})
    assert "ms/token: in-process 34.2 % slower than HTTP+SSE (not within 5 %)." in md


def test_in_process_side_asks_what_the_http_side_sends(monkeypatch):
    """The in-process side's Sampling comes from the same body workload.over_http posts: same generation config."""
    from ops.host import client

    sent: list[dict] = []

    def fake_chat(url, body, *args, **kwargs):
        sent.append(body)
        return client.Answer(error="not sending")

    monkeypatch.setattr(client, "chat", fake_chat)
    png = workload.test_image(32, 24, seed=3)
    with pytest.raises(client.ChatError, match="not sending"):
        workload.over_http("http://127.0.0.1:9", png, 17)
    assert sent == [request_body(png, 17)]


def test_in_process_side_gets_the_services_sampling():
    from service.engine.conversation import Sampling
    from service.engine.images import ImageLimits, prepare
    from service.http import openai_request

    limits = ImageLimits(10 * 2**20, 40_000_000, 448)
    png = workload.test_image(32, 24, seed=3)
    parsed = openai_request.parse(request_body(png, 64), "m", 4096, 4,
                                  lambda url, param, detail: prepare(png, limits, param))
    assert parsed.sampling == Sampling(max_tokens=64, ignore_eos=True)  # greedy, fixed length
    assert parsed.conversation.turns[0].text == workload.PROMPT


@pytest.mark.parametrize(("env", "full", "small"), [
    ({}, (448, 299), (416, 277)),  # the service's default budget: long side 448
    ({"VLFLEET_IMAGE_MAX_SIDE": "320"}, (320, 213), (320, 213)),
    ({"VLFLEET_IMAGE_MAX_SIDE": "0"}, (1200, 800), (416, 277)),  # downscaling off
])
def test_size_the_model_sees_comes_from_the_services_settings(monkeypatch, tmp_path, env, full, small):
    monkeypatch.delenv("VLFLEET_IMAGE_MAX_SIDE", raising=False)
    assert server.model_size(workload.test_image(1200, 800), tmp_path, env) == full
    assert server.model_size(workload.test_image(416, 277), tmp_path, env) == small

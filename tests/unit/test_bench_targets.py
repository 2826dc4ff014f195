"""Issue 9's targets evaluated from a results dict, and the markdown report rendered from it."""

from __future__ import annotations

import pytest

from ops.bench.report import render, table
from ops.bench.targets import Target, evaluate, summary


def results(**over) -> dict:
    r = {
        "baselines": {"fp32": {"first_token_s": 6.0, "ms_per_token": 400.0, "total_s": 31.0,
                               "peak_rss_bytes": 8.6e9, "load_s": 20.0},
                      "bf16": {"first_token_s": 2.8, "ms_per_token": 260.0, "total_s": 19.0,
                               "peak_rss_bytes": 4.6e9, "load_s": 10.0}},
        "machine_limit": {"bandwidth": {"one_thread": 25e9, "all_threads": 26e9, "threads": 2,
                                        "array_bytes": 2**30, "passes": 5},
                          "weights": {"int4": {"total": 1.044e9, "lm_head": 0.31e9}},
                          "floor_ms_per_token": {"int4": 40.0}},
        "service": {"int4": {"cold_start_s": 30.0, "peak_rss_bytes": 2.3e9,
                             "image_416": {"first_token_s": 1.0, "ms_per_token": 45.0, "total_s": 3.9},
                             "followup": {"runs": 3, "reused": 3, "first_first_token_s": 1.0,
                                          "followup_first_token_s": 0.2}}},
        "concurrency": {"serial": [
            {"clients": 1, "tokens_per_s": 20.0, "first_token_p50_s": 1.0, "first_token_p95_s": 1.0, "errors": 0},
            {"clients": 4, "tokens_per_s": 21.0, "first_token_p50_s": 6.0, "first_token_p95_s": 9.0, "errors": 0}]},
        "overhead": {"first_token_s_ratio": 1.01, "ms_per_token_ratio": 1.00,
                     "in_process": {"first_token_s": 1.0, "ms_per_token": 45.0},
                     "http_sse": {"first_token_s": 1.01, "ms_per_token": 45.0}},
    }
    r.update(over)
    return r


def by_id(targets: list[Target]) -> dict[str, Target]:
    return {t.id: t for t in targets}


def test_ratios_against_same_run_baselines():
    t = by_id(evaluate(results()))
    assert t["first-vs-fp32"].measured == pytest.approx(1.0 / 6.0)
    assert t["first-vs-fp32"].met is True
    assert t["first-vs-bf16"].measured == pytest.approx(1.0 / 2.8)
    assert t["tpot-vs-floor"].measured == pytest.approx(45.0 / 40.0)
    assert t["tpot-vs-floor"].met is True  # 1.125 <= 1.15
    assert t["rss-vs-fp32"].measured == pytest.approx(2.3 / 8.6)
    assert t["followup"].measured == pytest.approx(0.2)


def test_concurrency_targets_per_engine_and_direction():
    t = by_id(evaluate(results()))
    assert t["c4-throughput-serial"].measured == pytest.approx(1.05)
    assert t["c4-throughput-serial"].met is False  # higher is better: 1.05 < 2.5
    assert t["c4-p95-serial"].measured == pytest.approx(9.0)
    assert t["c4-p95-serial"].met is False
    assert t["c4-errors-serial"].met is True


def test_missing_sections_are_not_evaluated_never_met():
    t = by_id(evaluate({"service": {}}))
    assert t["first-vs-fp32"].met is None
    assert t["tpot-vs-floor"].met is None
    assert not any(x.id.startswith("c4-") for x in t.values())
    s = summary(list(t.values()))
    assert s["met"] == 0 and s["not_evaluated"] == s["total"]


def test_slower_service_fails_the_first_token_target():
    r = results()
    r["service"]["int4"]["image_416"]["first_token_s"] = 2.0
    t = by_id(evaluate(r))
    assert t["first-vs-fp32"].met is False  # 2/6 = 0.33 > 0.20
    assert t["first-abs"].met is False
    assert t["peer-first"].met is True  # still below llama-server's 4.5 s


def test_markdown_has_targets_and_runtime_tables():
    r = results()
    r["targets"] = [t.as_dict() for t in evaluate(r)]
    md = render(r, ["bench-first-token.png"])
    assert "## Targets (issue 9)" in md
    assert "| first token, int4 / transformers fp32 | 0.167x | <= 0.2x | met |" in md
    assert "**not met**" in md  # the serial engine's 4-client throughput
    assert "| transformers fp32 | 6.00 | 400.0 |" in md
    assert "| service int4 (HTTP+SSE) | 1.00 | 45.0 | 3.90 | 2.30 | 30.0 | 0.167x |" in md
    assert "![bench-first-token.png](bench-first-token.png)" in md
    assert "## Machine limit" in md and "26.0 GB/s on 2 threads" in md


def test_markdown_lists_failed_sections():
    md = render({"errors": {"baselines": "RuntimeError: out of memory"}})
    assert "- baselines: RuntimeError: out of memory" in md


def test_table_shape():
    assert table(["a", "b"], [["1", "2"]]).splitlines() == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def test_large_measurements_render_without_exponents():
    r = results()
    r["service"]["int4"]["image_416"]["ms_per_token"] = 1007.3
    r["targets"] = [t.as_dict() for t in evaluate(r)]
    md = render(r)
    assert "| 1007 ms | <= 40.5 ms | **not met** |" in md
    assert "e+" not in md


def test_throughput_also_reported_against_the_fastest_single_client():
    r = results()
    r["concurrency"]["batching"] = [
        {"clients": 1, "tokens_per_s": 10.0, "first_token_p50_s": 1.2, "first_token_p95_s": 1.2, "errors": 0},
        {"clients": 4, "tokens_per_s": 30.0, "first_token_p50_s": 2.0, "first_token_p95_s": 3.0, "errors": 0}]
    t = by_id(evaluate(r))
    assert t["c4-throughput-batching"].measured == pytest.approx(3.0)
    assert t["c4-throughput-batching"].met is True
    assert t["c4-throughput-batching"].detail == "1.50x the fastest engine's one client"  # serial alone: 20 tok/s


def test_memory_split_is_reported():
    r = results()
    r["service"]["int4"]["memory"] = {"VmHWM": 3.0e9, "VmRSS": 2.9e9, "RssAnon": 1.8e9, "RssFile": 1.1e9}
    md = render(r)
    assert "int4 worker after the single-client runs: RSS 2.90 GB = 1.80 GB anonymous" in md
    assert "1.10 GB file-backed" in md

"""docs/tuning.md is rendered from bench.json files: per CPU class, the newest run that measured each decision."""

from __future__ import annotations

import json
from pathlib import Path

from ops.bench.tuning_page import render

AVX512 = {"cpu": "AMD EPYC", "isa": ["avx2", "avx512f"]}
AVX2 = {"cpu": "AMD EPYC", "isa": ["avx2"]}


def write(results: Path, name: str, started: str, machine: dict, **data) -> None:
    run = results / name
    run.mkdir(parents=True)
    (run / "bench.json").write_text(json.dumps({"meta": {"started": started, "machine": machine, "tokens": 128},
                                                **data}))


def lever(name: str, setting: str, first: float, ms: float) -> dict:
    return {"name": name, "setting": setting, "first_token_s": first, "ms_per_token": ms, "peak_rss_bytes": 3e9}


def test_each_cpu_class_gets_its_own_advice_from_its_newest_run(tmp_path):
    results = tmp_path / "results"
    tune = {"engine": "direct", "why": "fastest within budget", "tokens": 128,
            "candidates": {"serial": {"status": "ok", "score_s": 9.0}, "direct": {"status": "ok", "score_s": 7.5}}}
    write(results, "old", "2026-11-01 10:00", AVX512, tune={**tune, "engine": "serial"})
    write(results, "new", "2026-11-02 10:00", AVX512, tune=tune)
    write(results, "avx2", "2026-11-03 10:00", AVX2, levers=[
        lever("baseline", "service defaults", 2.0, 100.0),
        lever("precision", "VLFLEET_PRECISION=f32", 2.05, 80.0),  # decode 20 % faster, first token 2.5 % slower
        lever("threads", "VLFLEET_THREADS=1", 1.9, 97.0)])  # within noise: not advice
    md = render(results)
    avx512 = md.split("## AMD EPYC (avx2, avx512f)")[1].split("## AMD EPYC (avx2)")[0]
    assert "Pick **direct** (fastest within budget)" in avx512 and "results/new/bench.json" in avx512
    assert "| direct | ok | 7.50 |" in avx512
    avx2 = md.split("## AMD EPYC (avx2)\n")[1]
    assert "### Engine\n\nNot measured on this CPU class." in avx2
    assert "here: VLFLEET_PRECISION=f32." in avx2
    assert "THREADS=1." not in avx2



def test_a_lever_must_beat_the_defaults_measured_at_both_ends(tmp_path):
    """A machine that was slow while the first baseline ran must not turn every later row into advice."""
    results = tmp_path / "results"
    write(results, "drift", "2026-11-03 10:00", AVX2, levers=[
        lever("baseline", "service defaults", 2.0, 100.0),  # slow start of the section
        lever("KV cache", "VLFLEET_KV_PRECISION=f16", 1.6, 98.0),  # only as fast as the defaults measured later
        lever("dynamic quantisation", "VLFLEET_DQ_GROUP_SIZE=32", 2.0, 97.0),
        lever("baseline", "service defaults, again after the others", 1.6, 97.0)])
    md = render(results)
    assert "No lever beat the defaults" in md
    assert "| KV cache | VLFLEET_KV_PRECISION=f16 | 1.60 | 1.00x |" in md
    assert "| dynamic quantisation | VLFLEET_DQ_GROUP_SIZE=32 | 2.00 | 1.25x |" in md


def test_a_lever_must_move_more_than_the_defaults_own_runs_spread(tmp_path):
    """On a sitting where the defaults' answers wander by 20 %, a lever 15 % faster is noise; one 30 % faster is
    not. The band comes from the int4 section's runs of the same bench run."""
    results = tmp_path / "results"
    samples = [{"first_token_s": 1.0, "ms_per_token": ms} for ms in (40.0, 50.0, 48.0)]  # decode spread 10/48
    write(results, "noisy", "2026-11-03 10:00", AVX2,
          service={"int4": {"image_416": {"samples": samples}}}, levers=[
              lever("baseline", "service defaults", 1.0, 50.0),
              lever("KV cache", "VLFLEET_KV_PRECISION=f32", 1.0, 42.5),  # 0.85x: inside the 21 % band
              lever("weight format", "int4 symmetric", 1.0, 35.0)])  # 0.70x: beyond it
    md = render(results)
    assert "here: int4 symmetric." in md
    assert "(first token 5%, decode 21%: the int4 section's runs, at least 5%)" in md


def test_concurrency_names_the_engines_its_run_could_not_measure(tmp_path):
    results = tmp_path / "results"
    level = {"clients": 4, "tokens_per_s": 20.0, "first_token_p95_s": 6.0, "errors": 0}
    write(results, "run", "2026-11-02 10:00", AVX512, concurrency={"paged": [level]},
          errors={"engine batching": "TimeoutError: timed out", "peer": "no build"},
          tune_load={"engine": "paged", "why": "fastest", "clients": 4, "followups": 1})
    md = render(results)
    assert "Not measured in this run: batching (TimeoutError: timed out)." in md and "no build" not in md
    assert "`vlfleet tune --clients 4 --followups 1` picks **paged**" in md
    write(results, "later", "2026-11-03 10:00", AVX512, concurrency={"paged": [level]})
    assert "Not measured in this run" not in render(results)

"""Choosing what `vlfleet bench` runs: --only sections, quick plans, engines offered by the service."""

from __future__ import annotations

from typing import ClassVar

import pytest

from ops.bench.suite import SECTIONS, Plan, parse_only, service_engines


def test_only_keeps_run_order_and_expands_service():
    assert parse_only("concurrency,service") == ("int4", "images", "followup", "concurrency")
    assert parse_only(None) == SECTIONS
    assert "levers" not in parse_only(None)
    assert parse_only("levers,machine") == ("machine", "levers")


def test_only_rejects_unknown_sections_with_the_choices():
    with pytest.raises(ValueError, match="choose from: machine, baselines"):
        parse_only("machine,gpu")


def test_quick_plan_is_smaller_than_the_full_one():
    quick, full = Plan.quick(), Plan()
    assert quick.runs < full.runs and quick.rounds <= full.rounds
    assert max(quick.clients) == 4 and max(full.clients) == 8


def test_engines_come_from_the_service_settings():
    engines, default = service_engines()
    assert engines and set(engines) <= {"serial", "direct", "batching", "hybrid", "paged"}
    assert default is None or default in engines


def test_peer_is_a_section_of_the_full_run_and_can_run_alone():
    assert "peer" in parse_only(None)
    assert parse_only("peer") == ("peer",)
    assert parse_only("peer,service") == ("int4", "images", "followup", "peer")


def test_the_machine_block_names_the_cpu_and_its_isa_flags():
    from ops.bench.suite import _machine
    from ops.machine import ISA_FLAGS, describe

    block, machine = _machine(), describe()
    assert {k: block[k] for k in ("cpu", "isa", "cpus")} == {k: machine[k] for k in ("cpu", "isa", "cpus")}
    assert set(block["isa"]) <= set(ISA_FLAGS)
    assert block["memory_bytes"] > 0 and "openvino" in block["versions"]


def test_the_machine_is_named_with_its_cpu_generation(tmp_path):
    from ops.bench.bench_md import render
    from ops.machine import describe

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
                       "flags\t\t: fpu avx2 avx512f\n")
    machine = describe(cpuinfo)
    assert (machine["cpu"], machine["generation"], machine["isa"]) == ("AMD EPYC", "family 26, model 2",
                                                                      ["avx2", "avx512f"])
    assert "Machine: AMD EPYC (family 26, model 2; ISA: avx2, avx512f), " in render({"meta": {"machine": machine}})
    assert describe(tmp_path / "absent")["generation"] == ""
    assert "Machine: AMD EPYC (ISA: avx2), " in render({"meta": {"machine": {"cpu": "AMD EPYC", "isa": ["avx2"]}}})


def test_every_engine_with_a_follow_up_gets_a_row_and_a_target():
    from ops.bench.bench_md import followup_section
    from ops.bench.targets import evaluate

    def fu(first, follow):
        return {"runs": 2, "reused": 2, "first_first_token_s": first, "followup_first_token_s": follow,
                "embeddings_s": {"first": 1.0, "followup": 0.9}, "vision_encoder_runs": {"first": 2, "followup": 0}}

    results = {"service": {"int4": {"engine": "serial", "followup": fu(2.0, 1.4)},
                           "int4_direct": {"engine": "direct", "followup": fu(2.0, 0.2)}}}
    text = "\n".join(followup_section(results))
    assert "| serial |" in text and "| direct |" in text and "2 / 0" in text
    by_id = {t.id: t for t in evaluate(results)}
    assert by_id["followup"].measured == 0.7 and by_id["followup"].met is False
    assert by_id["followup-direct"].measured == 0.1 and by_id["followup-direct"].met is True


def test_every_engine_with_structured_answers_gets_a_row_and_a_target():
    from ops.bench.bench_md import structured_section
    from ops.bench.targets import evaluate

    def st(plain, constrained):
        def part(ms, tokens):
            return {"runs": 2, "ms_per_token": ms, "first_token_s": 1.0,
                    "samples": [{"tokens": t} for t in tokens]}
        return {"runs": 2, "plain": part(plain, (128, 128)), "constrained": part(constrained, (128, 40))}

    results = {"service": {"int4": {"engine": "direct", "structured": st(50.0, 54.0)},
                           "int4_serial": {"engine": "serial", "structured": st(50.0, 60.0)}}}
    text = "\n".join(structured_section(results))
    assert "| direct | 50.0 | 54.0 | 1.080x |" in text and "| serial |" in text and "| 84 |" in text, text
    by_id = {t.id: t for t in evaluate(results)}
    assert by_id["structured-direct"].measured == 1.08 and by_id["structured-direct"].met is True
    assert by_id["structured-serial"].measured == 1.2 and by_id["structured-serial"].met is False


class FakeServer:
    """Stands in for ops.bench.server.Server: records its start and stop by log name, answers nothing itself."""

    events: ClassVar[list[tuple[str, str]]] = []
    failing: ClassVar[set[str]] = set()

    def __init__(self, model, log, env=None):
        self.name, self.env, self.url, self.cold_start_s = log.name, env or {}, f"http://{log.name}", 1.5

    def __enter__(self):
        self.events.append(("start", self.name))
        if self.name in self.failing:
            raise RuntimeError(f"{self.name} would not start")
        return self

    def __exit__(self, *exc):
        self.events.append(("stop", self.name))

    def peak_rss(self):
        return {"worker": 7, "all": 9}

    def memory(self):
        return {"VmRSS": 5}


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """``run(only, failing=...)``: the suite's real table and sections over FakeServer and canned answers."""
    from ops.bench import suite

    FakeServer.events = []
    monkeypatch.setattr(suite, "Server", FakeServer)
    monkeypatch.setattr(suite, "service_engines", lambda: (("direct", "serial"), "direct"))
    monkeypatch.setattr(suite, "_machine", dict)
    monkeypatch.setattr(suite, "write", lambda results, out: None)
    monkeypatch.setattr(suite, "seen_size", lambda s, w, h, detail=None: f"{w}x{h}")
    monkeypatch.setattr(suite, "_answers", lambda url, plan, w, h, seed, say, label, detail=None: {
        "first_token_s": 1.0, "ms_per_token": 2.0, "runs": plan.runs, "prompt_tokens": 10, "url": url})
    monkeypatch.setattr(suite, "_followup", lambda url, plan, say: {"url": url})
    monkeypatch.setattr(suite, "_structured", lambda url, plan, say: {"url": url})
    monkeypatch.setattr(suite, "_concurrency", lambda url, plan, say, engine: [{"url": url}])

    def run(only: str, failing: tuple[str, ...] = ()) -> dict:
        FakeServer.failing = set(failing)
        plan = Plan(sections=parse_only(only), out=tmp_path, log_dir=tmp_path)
        return suite.run(plan, lambda fmt: tmp_path / fmt, lambda: tmp_path / "ckpt")
    return run


def test_the_int4_sections_share_one_service_and_other_engines_get_their_own(fake_run):
    results = fake_run("images,followup,concurrency")
    assert results["meta"]["sections"] == ["images", "followup", "concurrency"]  # as asked; int4 runs for them
    assert FakeServer.events == [("start", "int4.log"), ("stop", "int4.log"), ("start", "int4-full.log"),
                                 ("stop", "int4-full.log"), ("start", "int4-serial.log"), ("stop", "int4-serial.log")]
    int4 = results["service"]["int4"]
    assert list(int4) == ["engine", "cold_start_s", "image_416", "images", "followup", "peak_rss_bytes", "memory",
                          "peak_rss_after_concurrency_bytes"]
    assert list(int4["images"]) == ["416x277", "1200x800", "1200x800 detail low", "1200x800 detail high",
                                    "1200x800 (no downscale)"]
    assert int4["images"]["1200x800 (no downscale)"]["url"] == "http://int4-full.log"
    assert results["service"]["int4_serial"]["followup"] == {"url": "http://int4-serial.log"}
    assert list(results["concurrency"]) == ["direct", "serial"] and not results["errors"]


def test_a_failed_section_skips_what_requires_it_and_the_run_goes_on(fake_run):
    results = fake_run("int8,followup", failing=("int4.log",))
    assert list(results["errors"]) == ["int4"]
    assert results["errors"]["int4"].startswith("RuntimeError: int4.log would not start (at test_bench_suite.py:")
    assert "int4" not in results["service"] and results["service"]["int8"]["peak_rss_bytes"] == 7
    assert [e for e in FakeServer.events if e[0] == "start"] == [("start", "int8.log"), ("start", "int4.log")]


def test_structured_runs_on_the_shared_int4_service_and_on_each_other_engine(fake_run):
    results = fake_run("structured")
    assert results["service"]["int4"]["structured"] == {"url": "http://int4.log"}
    assert results["service"]["int4_serial"]["structured"] == {"url": "http://int4-serial.log"}
    assert not results["errors"]


def test_the_gguf_levers_run_on_the_hybrid_engine_between_the_two_defaults_runs(tmp_path):
    from ops.bench.suite import GGUF_LEVERS, LEVERS, PeerInputs, levers_to_run

    asked = []

    def peer_inputs(output_type=None):
        asked.append(output_type)
        return PeerInputs(tmp_path / "llama-server", tmp_path / f"gguf-{output_type}", {}, tmp_path / "lib.so")

    def artifact(kind):
        return tmp_path / kind

    assert [lv.setting for lv in levers_to_run(artifact, None, "c")] == [row[1] for row in LEVERS]
    levers = levers_to_run(artifact, peer_inputs, "/cache")
    assert [lv.setting for lv in levers] == [row[1] for row in LEVERS[:-1]] + [g[0] for g in GGUF_LEVERS] + [
        LEVERS[-1][1]]
    assert asked == []  # nothing is built until its lever runs
    gguf = [lv for lv in levers if lv.name == "GGUF output tensor"]
    envs = [lv.env() for lv in gguf]
    assert asked == [output for _, output in GGUF_LEVERS]
    assert [e["VLFLEET_LLAMACPP_MODEL_DIR"] for e in envs] == [str(tmp_path / f"gguf-{o}") for o in asked]
    assert all(e["VLFLEET_ENGINE"] == "hybrid" for e in envs) and {lv.rss for lv in gguf} == {"all"}
    assert {lv.model() for lv in gguf} == {tmp_path / "int4"}
    cache = next(lv for lv in levers if "first start" in lv.setting)
    assert cache.env() == {"VLFLEET_MODEL_CACHE_DIR": "/cache"} and cache.model() == tmp_path / "int4"
    assert next(lv for lv in levers if lv.kind == "int4-sym").model() == tmp_path / "int4-sym"


def test_a_lever_that_fails_costs_its_own_row_only(tmp_path, monkeypatch):
    from ops.bench import bench_md, suite

    class Started:
        url, cold_start_s = "http://127.0.0.1:9", 1.0

        def __init__(self, model, log, env):
            if env.get("VLFLEET_THREADS") == "1":
                raise RuntimeError("the service exited while starting")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def peak_rss(self):
            return {"worker": 1, "all": 2}

    monkeypatch.setattr(suite, "Server", Started)
    monkeypatch.setattr(suite, "_answers", lambda *a: {"first_token_s": 1.0, "ms_per_token": 50.0, "runs": 1})
    monkeypatch.setattr(suite, "seen_size", lambda *a: None)
    monkeypatch.setattr(suite, "_compile_cache", lambda: str(tmp_path / "cache"))
    plan = Plan(runs=1, log_dir=tmp_path)
    said = []
    rows, failed = suite.lever_ab(plan, lambda kind: tmp_path / kind, said.append)
    assert [f["setting"] for f in failed] == ["VLFLEET_THREADS=1"] and "exited while starting" in failed[0]["error"]
    assert len(rows) == len(suite.LEVERS) - 1 and rows[-1]["setting"] == suite.LEVERS[-1][1]
    assert any("VLFLEET_THREADS=1 FAILED" in line for line in said)
    md = bench_md.render({"meta": {}, "levers": rows, "levers_failed": failed, "errors": {}})
    assert "- lever VLFLEET_THREADS=1 failed: RuntimeError: the service exited while starting" in md


def test_a_failed_section_names_where_it_raised():
    from ops.bench import suite

    def read_socket():
        raise TimeoutError("timed out")

    try:
        read_socket()
    except TimeoutError as e:
        where = suite.raised_at(e)
    assert where.startswith(" (at test_bench_suite.py:") and where.endswith(" in read_socket)"), where
    assert suite.raised_at(TimeoutError("never raised")) == ""

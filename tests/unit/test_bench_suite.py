"""Choosing what `vlfleet bench` runs: --only sections, quick plans, engines offered by the service."""

from __future__ import annotations

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
    assert engines and set(engines) <= {"serial", "direct", "batching"}
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


def test_every_engine_with_a_follow_up_gets_a_row_and_a_target():
    from ops.bench.report import followup_section
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

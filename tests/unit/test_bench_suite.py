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
    assert engines and set(engines) <= {"serial", "batching"}
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

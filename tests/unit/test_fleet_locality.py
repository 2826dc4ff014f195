"""The cache-locality benchmark's arithmetic and its results page (ops/bench/fleet_locality.py); the fleet runs are
`vlfleet bench.locality` (results/fleet-locality/), the routing itself is tested in tests/integration/test_lb_routing.py
and tests/e2e/test_affinity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench import fleet_locality
from ops.bench.fleet_locality import Plan, Turn, load_dir, render, summarize
from ops.fleet.inventory import Host, Inventory

REPO = Path(__file__).resolve().parents[2]
PLAN = Plan(conversations=2, followups=2)


def _turns(follow_host: str) -> list[Turn]:
    """Two conversations on c1 and c2; conversation 1's follow-ups go to ``follow_host``."""
    out = []
    for conv, home in ((0, "c1"), (1, "c2")):
        out.append(Turn(conv, "openai", 0, host=home, status=200, first_token_s=2.0, answer_cache="miss"))
        out.append(Turn(conv, "repeat", 0, host=home if conv == 0 else "c1", status=200, first_token_s=0.01,
                        answer_cache="hit" if conv == 0 else "miss"))
        for n in (1, 2):
            host = home if conv == 0 else follow_host
            out.append(Turn(conv, "openai", n, host=host, status=200, first_token_s=0.4 if host == home else 1.8,
                            route="affinity"))
    return out


def test_summary_tells_a_kept_conversation_from_a_scattered_one():
    counters = {"vision_encoder_runs": 2, "reused_prompt_tokens": 100, "answer_cache_hits": 1, "session_reuse": 2}
    kept = summarize(_turns("c2"), {"c1": counters, "c2": counters}, PLAN)
    assert kept["followups_on_first_host"] == 1.0 and kept["followup_first_token_ratio"] == 0.2
    assert kept["repeats_from_answer_cache"] == 0.5 and kept["failed"] == 0
    assert kept["vision_encoder_runs"] == 4 and kept["vision_encoder_runs_over_one_per_image"] == 2
    scattered = summarize(_turns("c1"), {"c1": counters, "c2": counters}, PLAN)
    assert scattered["followups_on_first_host"] == 0.5
    assert scattered["followup_first_token_ratio"] > kept["followup_first_token_ratio"]
    assert scattered["turns_per_host"] == {"c1": 7, "c2": 1} and scattered["max_share_of_even"] == 1.75


def test_a_failed_turn_counts_and_has_no_first_token():
    turns = [*_turns("c2"), Turn(1, "openai", 3, host="c2", status=503, error="overloaded")]
    assert summarize(turns, {"c1": {k: 0 for k in fleet_locality.COUNTERS}}, PLAN)["failed"] == 1


def test_each_run_gets_its_own_images_and_questions():
    assert fleet_locality.image_data("run-a", 0, (40, 30)) != fleet_locality.image_data("run-b", 0, (40, 30))
    assert fleet_locality.image_data("run-a", 0, (40, 30)) != fleet_locality.image_data("run-a", 1, (40, 30))


def test_the_page_is_made_from_the_run_files(tmp_path):
    counters = {k: 1.0 for k in fleet_locality.COUNTERS}
    for label, host in (("1-off", "c1"), ("2-on", "c2")):
        fleet_locality.save({"label": label, "machine": {"cpu": "Test CPU", "cpus": 2, "isa": ["avx2"]},
                             "fleet": {"hosts": ["c1", "c2"], "lb": "lb1", "kinds": {"c1": "container"}},
                             "plan": vars(PLAN) | {"image_px": [416, 277]}, "turns": [],
                             "summary": summarize(_turns(host), {"c1": counters}, PLAN)}, tmp_path)
    page = (tmp_path / "README.md").read_text()
    assert "Test CPU (2 cores; avx2)" in page and "c1 (container), c2 (host) behind lb1" in page
    table = [line.strip("|").split(" | ") for line in page.splitlines() if line.startswith("| ")]
    column = [h.strip() for h in table[0]].index("follow-ups on the first question's host")
    assert [row[column].strip() for row in table[1:]] == ["50%", "100%"]


def test_committed_locality_results_match_their_page():
    out = REPO / "results" / "fleet-locality"
    runs = load_dir(out)
    assert runs, f"no runs in {out}: `vlfleet bench.locality` writes them"
    assert (out / "README.md").read_text() == render(runs)
    for run in runs:  # every figure is the runs' own: the summary is what its turns and counters give
        turns = [Turn(**t) for t in run["turns"]]
        plan = Plan(**{**run["plan"], "image_px": tuple(run["plan"]["image_px"])})
        again = {"clients": plan.clients, "seconds": run["summary"]["seconds"], **summarize(turns, run["hosts"], plan)}
        assert run["summary"] == json.loads(json.dumps(again))
        assert run["machine"]["cpu"] and run["machine"]["isa"]


def test_a_fleet_without_an_lb_is_refused_with_what_is_missing():
    inv = Inventory({"c1": Host("c1", {"ansible_host": "127.0.0.1"}, ["vlm"])})
    with pytest.raises(ValueError, match="needs an `lb` group"):
        fleet_locality.run(inv, PLAN, "x")

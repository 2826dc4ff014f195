"""Every alert in ops/monitoring/alerts.yml, firing and not firing, evaluated by Prometheus' own `promtool test rules`.

promtool compares annotations too; they are templates over the firing value, so the behaviour tests run on a copy of
the rules without annotations (same names, expressions, `for` and labels) and `promtool check rules` validates the
real file's templates.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from ops.monitoring import ALERTS
from tests.prereq import require_tools

SVC = 'job="vlfleet", instance="c1"'
LABELS = {"job": "vlfleet", "instance": "c1"}


def _hist(name: str, per_minute: dict[str, int], minutes: int = 30) -> list[dict]:
    """Cumulative histogram bucket series growing by ``per_minute`` observations in each bucket (le -> count)."""
    return [{"series": f'{name}_bucket{{{SVC}, le="{le}"}}', "values": f"0+{n}x{minutes}"}
            for le, n in per_minute.items()]


# alert -> cases: (what it shows, input series, eval time, expected alert labels or None for "does not fire")
CASES: dict[str, list[tuple[str, list[dict], str, dict | None]]] = {
    "VlfleetTargetDown": [
        ("scrape fails for 5 minutes", [{"series": f"up{{{SVC}}}", "values": "0x10"}], "5m", LABELS),
        ("one failed scrape is not an outage", [{"series": f"up{{{SVC}}}", "values": "1 1 0 1 1 1"}], "3m", None),
        ("target up", [{"series": f"up{{{SVC}}}", "values": "1x10"}], "5m", None),
    ],
    "VlfleetNotReady": [
        ("model never became ready", [{"series": f"vlfleet_ready{{{SVC}}}", "values": "0x10"}], "6m", LABELS),
        ("3-minute model load, then ready", [{"series": f"vlfleet_ready{{{SVC}}}", "values": "0 0 0 1x10"}], "8m",
         None),
    ],
    "VlfleetRestarted": [
        ("process start time changed (a restart)", [{"series": f"vlfleet_process_start_time_seconds{{{SVC}}}",
                                 "values": "1000x5 1400x5"}], "7m", LABELS),
        ("same process all along", [{"series": f"vlfleet_process_start_time_seconds{{{SVC}}}",
                                     "values": "1000x20"}], "10m", None),
    ],
    "VlfleetCrashLooping": [
        ("three restarts in 8 minutes", [{"series": f"vlfleet_process_start_time_seconds{{{SVC}}}",
                                          "values": "100 100 200 200 300 300 400 400"}], "8m", LABELS),
        ("scrapes flapping up/down", [{"series": f"up{{{SVC}}}", "values": "1 0 1 0 1 0 1 0 1"}], "8m", LABELS),
        ("one restart (a rollout)", [{"series": f"vlfleet_process_start_time_seconds{{{SVC}}}",
                                      "values": "100x5 200x5"}], "10m", None),
    ],
    "VlfleetLbDown": [
        ("nginx entry not answering", [{"series": 'up{job="vlfleet_lb", instance="lb1"}', "values": "0x10"}], "5m",
         {"job": "vlfleet_lb", "instance": "lb1"}),
        ("a backend down is not the lb down", [{"series": 'up{job="vlfleet_lb", instance="lb1"}', "values": "1x10"},
                                               {"series": f"up{{{SVC}}}", "values": "0x10"}], "5m", None),
    ],
    "VlfleetFirstTokenSlow": [
        ("every first token between 5 and 8 s for 20 minutes",
         _hist("vlfleet_time_to_first_token_seconds", {"1": 0, "5": 0, "8": 10, "+Inf": 10}), "20m",
         {"instance": "c1"}),
        ("first tokens under 1 s", _hist("vlfleet_time_to_first_token_seconds", {"1": 10, "5": 10, "8": 10,
                                                                                  "+Inf": 10}), "20m", None),
        ("slow for 5 minutes only",
         [{"series": f'vlfleet_time_to_first_token_seconds_bucket{{{SVC}, le="{le}"}}', "values": v} for le, v in
          (("1", "0+10x10 100+0x5 100+10x10"), ("5", "0+10x10 100+0x5 100+10x10"),
           ("8", "0+10x10 100+10x5 150+10x10"), ("+Inf", "0+10x10 100+10x5 150+10x10"))], "25m", None),
    ],
    "VlfleetQueueSaturated": [
        ("7 of 8 queue slots taken", [{"series": f"vlfleet_queue_depth{{{SVC}}}", "values": "7x10"},
                                      {"series": f"vlfleet_queue_capacity{{{SVC}}}", "values": "8x10"}], "6m", LABELS),
        ("half full", [{"series": f"vlfleet_queue_depth{{{SVC}}}", "values": "4x10"},
                       {"series": f"vlfleet_queue_capacity{{{SVC}}}", "values": "8x10"}], "6m", None),
        ("capacity unknown (0): no division by zero alert",
         [{"series": f"vlfleet_queue_depth{{{SVC}}}", "values": "5x10"},
          {"series": f"vlfleet_queue_capacity{{{SVC}}}", "values": "0x10"}], "6m", None),
    ],
    "VlfleetRejecting429": [
        ("10% of chat requests get 429 (probes do not dilute it)", [
            {"series": f'vlfleet_rejected_requests_total{{{SVC}, reason="429"}}', "values": "0+6x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="200"}}',
             "values": "0+54x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="429"}}',
             "values": "0+6x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/metrics", status="200"}}', "values": "0+5000x20"},
        ], "15m", {"instance": "c1"}),
        ("10% get 429 for the estimated wait (reason wait)", [
            {"series": f'vlfleet_rejected_requests_total{{{SVC}, reason="wait"}}', "values": "0+6x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="200"}}',
             "values": "0+54x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="429"}}',
             "values": "0+6x20"},
        ], "15m", {"instance": "c1"}),
        ("1% get 429", [
            {"series": f'vlfleet_rejected_requests_total{{{SVC}, reason="429"}}', "values": "0+1x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="200"}}',
             "values": "0+99x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="429"}}',
             "values": "0+1x20"},
        ], "15m", None),
        ("503s (timeouts) are not 429s", [
            {"series": f'vlfleet_rejected_requests_total{{{SVC}, reason="503"}}', "values": "0+30x20"},
            {"series": f'vlfleet_requests_total{{{SVC}, endpoint="/v1/chat/completions", status="503"}}',
             "values": "0+30x20"},
        ], "15m", None),
    ],
    "VlfleetMemoryNearLimit": [
        ("80% of MemoryHigh for 6 minutes", [{"series": f"vlfleet_memory_pressure{{{SVC}}}", "values": "0.8x10"}],
         "6m", LABELS),
        ("60% of the limit", [{"series": f"vlfleet_memory_pressure{{{SVC}}}", "values": "0.6x10"}], "6m", None),
    ],
    "VlfleetShedding": [
        ("shedding for 2 minutes", [{"series": f"vlfleet_shedding{{{SVC}}}", "values": "1x5"}], "2m", LABELS),
        ("a 1-minute blip", [{"series": f"vlfleet_shedding{{{SVC}}}", "values": "0 1 0 0 0"}], "3m", None),
        ("not shedding", [{"series": f"vlfleet_shedding{{{SVC}}}", "values": "0x5"}], "3m", None),
    ],
}


def _rules() -> dict:
    return yaml.safe_load(ALERTS.read_text())


def _severity(alert: str) -> str:
    return next(r["labels"]["severity"] for g in _rules()["groups"] for r in g["rules"] if r.get("alert") == alert)


@pytest.fixture(scope="module")
def bare_rules(tmp_path_factory):
    rules = _rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp_path_factory.mktemp("rules") / "alerts-bare.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def test_every_alert_has_firing_and_quiet_cases():
    alerts = [r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r]
    assert sorted(alerts) == sorted(CASES), "add cases for new alerts (or drop cases of removed ones)"
    for alert, cases in CASES.items():
        assert any(c[3] is not None for c in cases), f"{alert}: no firing case"
        assert any(c[3] is None for c in cases), f"{alert}: no non-firing case"


def test_promtool_check_rules_accepts_the_real_file():
    require_tools("promtool")
    done = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(CASES)} rules found" in done.stdout


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_cases(alert, bare_rules, tmp_path):
    require_tools("promtool")
    tests = []
    for _what, series, at, labels in CASES[alert]:
        expected = [] if labels is None else [{"exp_labels": {**labels, "severity": _severity(alert)}}]
        tests.append({"interval": "1m", "input_series": series,
                      "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}]})
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(bare_rules)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    names = "; ".join(f"#{i} {c[0]}" for i, c in enumerate(CASES[alert]))
    assert done.returncode == 0, f"{alert} cases ({names}):\n{done.stdout}{done.stderr}"


def test_docs_list_every_alert_with_its_tested_cases():
    from ops.paths import repo_root

    text = (repo_root() / "docs" / "monitoring.md").read_text()
    for alert, cases in CASES.items():
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{alert}` |")), None)
        assert row, f"docs/monitoring.md has no row for {alert}"
        for what, *_ in cases:
            assert what in row, f"docs/monitoring.md, {alert}: tested case {what!r} not listed"

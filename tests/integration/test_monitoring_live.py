"""The monitoring kit against the live service on the tiny model: every metric an alert or a dashboard query reads
is in the service's real /metrics, and label names in their selectors are on the series that have samples."""

from __future__ import annotations

import re

import pytest
import requests

from ops.monitoring import promql
from tests.integration.conftest import image_message

_SELECTOR = re.compile(r"(vlfleet_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_SAMPLE_LABELS = re.compile(r"^(vlfleet_[a-z0-9_]+)\{([^}]*)\}", re.MULTILINE)
ADDED_BY_PROMETHEUS = {"instance", "job"}  # target labels, not in the exposition


@pytest.fixture(scope="module")
def scrape(service) -> str:
    # One real streamed request first, so the histograms, token counters and request counters have samples.
    body = {"messages": [image_message()], "max_tokens": 4, "stream": True}
    with requests.post(service.url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert any(line == b"data: [DONE]" for line in r.iter_lines())
    r = requests.get(service.url + "/metrics", timeout=30)
    assert r.status_code == 200
    return r.text


def _all_exprs() -> dict[str, str]:
    return {**{f"alert {k}": v for k, v in promql.rule_exprs().items()},
            **{f"dashboard {k}": v for k, v in promql.dashboard_exprs().items()}}


def test_every_metric_in_alerts_and_dashboard_is_scraped(scrape):
    exposed = promql.exposed_names(scrape)
    assert "vlfleet_time_to_first_token_seconds_bucket" in exposed
    missing = {where: sorted(promql.metric_names(e) - exposed) for where, e in _all_exprs().items()
               if promql.metric_names(e) - exposed}
    assert not missing, f"not in the live /metrics: {missing}"


def test_selector_labels_exist_on_live_series(scrape):
    labels_of: dict[str, set[str]] = {}
    for name, raw in _SAMPLE_LABELS.findall(scrape):
        labels_of.setdefault(name, set()).update(m.group(1) for m in re.finditer(r'(\w+)="', raw))
    checked, wrong = 0, {}
    for where, expr in _all_exprs().items():
        for name, matchers in _SELECTOR.findall(expr):
            wanted = set(_MATCHER.findall(matchers)) - ADDED_BY_PROMETHEUS
            if name in labels_of and wanted:
                checked += 1
                if wanted - labels_of[name]:
                    wrong[where] = f"{name}: {sorted(wanted - labels_of[name])} not in {sorted(labels_of[name])}"
    assert checked, "no selector with labels was checked"
    assert not wrong, wrong


def test_gauges_the_alerts_need_have_values(scrape):
    # Alerts divide by the queue capacity and diff the start time: both must be set at start, not left at 0.
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(vlfleet_[a-z_]+) (\S+)$", scrape, re.M)}
    assert values["vlfleet_queue_capacity"] >= 1
    assert values["vlfleet_process_start_time_seconds"] > 1e9
    assert values["vlfleet_ready"] == 1

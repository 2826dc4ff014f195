"""The Grafana dashboard and the alert rules read only metrics the service declares (service/runtime/metrics.py), and
the dashboard is well-formed. tests/integration/test_monitoring_live.py checks the same against a live scrape."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from ops.monitoring import DASHBOARD, promql
from service.runtime.metrics import Metrics


@pytest.fixture(scope="module")
def declared() -> set[str]:
    return promql.exposed_names(generate_latest(Metrics().registry).decode())


def test_metric_name_extraction_ignores_strings_and_labels():
    expr = ('sum by (instance) (rate(vlfleet_requests_total{endpoint!~"/metrics|vlfleet_fake"}[5m])) '
            '/ on(instance) vlfleet_queue_capacity')
    assert promql.metric_names(expr) == {"vlfleet_requests_total", "vlfleet_queue_capacity"}


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_query_reads_declared_metrics(source, declared):
    exprs = promql.rule_exprs() if source == "alerts" else promql.dashboard_exprs()
    assert exprs
    missing = {where: sorted(promql.metric_names(e) - declared) for where, e in exprs.items()
               if promql.metric_names(e) - declared}
    assert not missing, f"queries use metrics service/runtime/metrics.py does not declare: {missing}"


def test_every_declared_family_is_on_the_dashboard():
    used = set().union(*(promql.metric_names(e) for e in promql.dashboard_exprs().values()))
    families = {f.name for f in Metrics().registry.collect()}
    suffixes = ("_total", "_bucket", "_sum", "_count", "_info", "")
    shown = {f for f in families if any(f + s in used for s in suffixes)}
    assert shown == families, f"not on the dashboard: {sorted(families - shown)}"


def test_dashboard_is_well_formed():
    data = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for p in data["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
    assert {v["name"] for v in data["templating"]["list"]} == {"datasource", "instance"}


def test_every_metric_is_described_in_the_docs():
    from ops.paths import repo_root

    text = (repo_root() / "docs" / "monitoring.md").read_text()
    for family in Metrics().registry.collect():
        name = family.name + {"counter": "_total", "info": "_info"}.get(family.type, "")
        assert f"`{name}`" in text or f"`{family.name}`" in text, f"docs/monitoring.md does not describe {name}"

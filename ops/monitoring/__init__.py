"""Monitoring kit for a vlfleet fleet: a Prometheus scrape config generated from the Ansible inventory
(scrape.py), alert rules (alerts.yml) and a Grafana dashboard (dashboard.json) over the service's /metrics."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
DASHBOARD = HERE / "dashboard.json"

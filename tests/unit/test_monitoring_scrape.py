"""`vlfleet monitoring.render`: the scrape config follows the inventory (as ansible-inventory reads it) and
Prometheus' own `promtool check config` accepts what it writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops.monitoring import scrape
from ops.monitoring.inventory import InventoryError, load
from tests.prereq import require_tools

VLFLEET = str(Path(sys.executable).with_name("vlfleet"))
INVENTORY = {"all": {"vars": {"ansible_user": "deploy"}, "children": {
    "vlm": {"vars": {"vlm_service_host": "{{ ansible_host }}"}, "hosts": {
        "vlm1": {"ansible_host": "10.0.0.11"},
        "vlm2": {"ansible_host": "10.0.0.12", "vlm_service_port": 8100},
        "vlm3": {"ansible_host": "fd00::13", "vlm_service_host": "127.0.0.1"}}},
    "lb": {"hosts": {"lb1": {"ansible_host": "10.0.0.10", "lb_listen_port": 8080}}}}}}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "inventory.yml"
    path.write_text(yaml.safe_dump(INVENTORY))
    return path


@pytest.fixture(scope="module")
def hosts(inventory):
    return load(inventory)


def _targets(config: dict, job: str) -> dict[str, str]:
    body = next(j for j in config["scrape_configs"] if j["job_name"] == job)
    return {sc["labels"]["instance"]: sc["targets"][0] for sc in body["static_configs"]}


def test_targets_follow_groups_addresses_and_ports(hosts):
    rendered = scrape.render(hosts)
    assert _targets(rendered.config, "vlfleet") == {"vlm1": "10.0.0.11:8000", "vlm2": "10.0.0.12:8100",
                                                    "vlm3": "[fd00::13]:8000"}
    assert _targets(rendered.config, "vlfleet_lb") == {"lb1": "10.0.0.10:8080"}
    assert rendered.config["rule_files"] == ["alerts.yml"]


def test_loopback_bound_service_is_warned_about(hosts):
    warnings = scrape.render(hosts).warnings
    assert len(warnings) == 1 and warnings[0].startswith("vlm3: the service binds 127.0.0.1")


def test_bearer_token_applies_to_every_job(hosts):
    config = scrape.render(hosts, bearer_token_file="/etc/prometheus/vlfleet.key").config
    for job in config["scrape_configs"]:
        assert job["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/vlfleet.key"}


def test_cli_writes_a_kit_promtool_accepts(inventory, tmp_path):
    require_tools("promtool")
    out = tmp_path / "kit"
    done = subprocess.run([VLFLEET, "monitoring.render", "--inventory", str(inventory), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["alerts.yml", "grafana-dashboard.json", "prometheus.yml"]
    check = subprocess.run(["promtool", "check", "config", str(out / "prometheus.yml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


def test_missing_or_unparsable_inventory_says_what_to_do(tmp_path):
    with pytest.raises(InventoryError, match="not found: pass --inventory"):
        load(tmp_path / "nope.yml")
    odd = tmp_path / "inventory.example"
    odd.write_text(yaml.safe_dump(INVENTORY))
    with pytest.raises(InventoryError, match=r"ends in \.yml or \.yaml"):
        load(odd)
    done = subprocess.run([VLFLEET, "monitoring.render", "--inventory", str(tmp_path / "nope.yml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "monitoring.render: inventory" in done.stderr and "not found" in done.stderr

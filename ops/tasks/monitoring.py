"""`vlfleet monitoring.render`: Prometheus scrape config + alert rules + Grafana dashboard for the inventory."""

from __future__ import annotations

from invoke import Exit, task


@task(help={
    "inventory": "Ansible inventory (see inventory.example); default: ./inventory.yml",
    "out": "directory to write prometheus.yml, alerts.yml and grafana-dashboard.json into (created)",
    "scrape_interval": "Prometheus scrape and rule evaluation interval (default: 15s)",
    "bearer_token_file": "file with one of the service's API keys, when VLFLEET_API_KEYS_FILE protects /metrics "
                         "(path as the Prometheus server sees it)",
})
def render(c, inventory="inventory.yml", out="monitoring", scrape_interval="15s", bearer_token_file=None):
    """Write the fleet's monitoring kit: scrape config (groups vlm, lb), alert rules, Grafana dashboard."""
    from ops.monitoring import scrape
    from ops.monitoring.inventory import InventoryError, load

    try:
        hosts = load(inventory)
    except InventoryError as e:
        raise Exit(f"monitoring.render: {e}") from e
    rendered = scrape.write(out, hosts, scrape_interval=scrape_interval, bearer_token_file=bearer_token_file)
    for warning in rendered.warnings:
        print(f"[monitoring] warning: {warning}")
    for path in rendered.files:
        print(f"[monitoring] wrote {path}")
    print("[monitoring] check: promtool check config " + str(rendered.files[0]))

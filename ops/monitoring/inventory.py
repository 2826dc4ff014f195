"""The inventory as Ansible reads it (ops.fleet.load_inventory: `ansible-inventory --list`), for the monitoring kit
and the fleet report, with a clear error when it holds no hosts."""

from __future__ import annotations

from pathlib import Path

from ops.fleet.inventory import FleetError, Host, load_inventory


class InventoryError(RuntimeError):
    """The inventory cannot be used; the message says what to fix."""


def load(inventory: Path | str) -> dict[str, Host]:
    """Every host of ``inventory`` (name -> ops.fleet.Host with groups and merged variables), in inventory order."""
    try:
        # Absolute: load_inventory runs ansible-inventory from the repository root, not the caller's directory.
        hosts = load_inventory(Path(inventory).expanduser().resolve()).hosts
    except FleetError as e:
        raise InventoryError(str(e)) from e
    hosts = {name: h for name, h in hosts.items() if name != "localhost" or h.vars}
    if not hosts:
        raise InventoryError(f"no hosts in {inventory}: Ansible reads a YAML inventory only when its name ends in .yml "
                             "or .yaml (copy inventory.example to inventory.yml)")
    return hosts


def resolve(host: Host, value: object) -> str:
    """A host variable's value with the two templates inventories commonly use filled in (no full Jinja)."""
    text = str(value)
    for name, sub in (("ansible_host", host.address), ("inventory_hostname", host.name)):
        text = text.replace("{{ " + name + " }}", sub).replace("{{" + name + "}}", sub)
    return text

"""The inventory as Ansible itself reads it (`ansible-inventory --list`): hosts, their groups and variables.

Going through ansible-inventory (not parsing YAML ourselves) accepts every inventory Ansible accepts (YAML, INI,
group_vars/host_vars beside it) and applies group variable precedence the same way the playbooks see it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


class InventoryError(RuntimeError):
    """The inventory cannot be read; the message says what to fix."""


@dataclass
class InventoryHost:
    name: str
    groups: list[str] = field(default_factory=list)
    vars: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host") or self.name)

    def resolve(self, value: object) -> str:
        """A host variable's value with the two templates inventories commonly use filled in (no full Jinja)."""
        text = str(value)
        for name, sub in (("ansible_host", self.address), ("inventory_hostname", self.name)):
            text = text.replace("{{ " + name + " }}", sub).replace("{{" + name + "}}", sub)
        return text


def _ansible_inventory() -> str:
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.exists() else "ansible-inventory"


def load(inventory: Path | str, timeout: float = 60) -> dict[str, InventoryHost]:
    """Every host of ``inventory`` in inventory order, with the groups it belongs to and its merged variables."""
    from ops.playbook import ansible_env

    path = Path(inventory).expanduser()
    if not path.exists():
        raise InventoryError(f"inventory {path} not found: pass --inventory PATH (see inventory.example, or the one "
                             "`vlfleet staging.up` prints)")
    try:
        done = subprocess.run([_ansible_inventory(), "-i", str(path), "--list"], env=ansible_env(),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise InventoryError("ansible-inventory not found: install the controller extra "
                             "(`pip install -e .[controller]`)") from e
    if done.returncode != 0:
        raise InventoryError(f"ansible-inventory could not read {path}: {done.stderr.strip()[-800:]}")
    data = json.loads(done.stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    hosts: dict[str, InventoryHost] = {}

    def walk(group: str) -> None:
        body = data.get(group, {})
        for name in body.get("hosts", []):
            host = hosts.setdefault(name, InventoryHost(name, vars=dict(hostvars.get(name, {}))))
            if group not in ("all", "ungrouped") and group not in host.groups:
                host.groups.append(group)
        for child in body.get("children", []):
            walk(child)

    walk("all")
    if not hosts:
        warnings = " ".join(ln.strip() for ln in done.stderr.splitlines() if "WARNING" in ln)[-600:]
        raise InventoryError(f"no hosts in {path}: Ansible reads a YAML inventory only when its name ends in .yml or "
                             f".yaml (copy inventory.example to inventory.yml) {warnings}".rstrip())
    return hosts

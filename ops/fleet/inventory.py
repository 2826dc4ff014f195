"""The live fleet's inventory, read the way Ansible reads it (`ansible-inventory --list`): hosts, their groups and
variables, and what the fleet operations take from them (address, release root, unit, python)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.paths import repo_root


class FleetError(RuntimeError):
    """The fleet cannot be worked on as asked (inventory, arguments); the message says what to change."""


@dataclass
class Host:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    def var(self, key: str, default: Any = None) -> Any:
        value = self.vars.get(key, default)
        # Values still holding Jinja (e.g. "{{ ansible_host }}") mean something only to Ansible: use the default.
        return default if isinstance(value, str) and "{{" in value else value

    @property
    def address(self) -> str:
        return str(self.var("ansible_host", self.name))

    @property
    def root(self) -> str:
        return str(self.var("vlfleet_root", "/opt/vlfleet"))

    @property
    def unit(self) -> str:
        return str(self.var("vlm_service_name", "vlfleet"))

    @property
    def python(self) -> str:
        value = str(self.var("ansible_python_interpreter", "/usr/bin/python3"))
        return value if value.startswith("/") else "/usr/bin/python3"


@dataclass
class Inventory:
    hosts: dict[str, Host]

    def group(self, name: str) -> list[Host]:
        return [h for h in self.hosts.values() if name in h.groups]


def load_inventory(path: Path | str) -> Inventory:
    """Read any Ansible inventory (YAML, INI, with group_vars) the way Ansible does: `ansible-inventory --list`."""
    from ops.playbook import PlaybookError, ansible_env, ansible_playbook_binary

    path = Path(path).expanduser().resolve()  # ansible-inventory runs from the repo root
    if not path.exists():
        raise FleetError(f"inventory {path} not found: pass --inventory PATH (see inventory.example, or the one "
                         f"`vlfleet staging.up` prints)")
    try:
        binary = ansible_playbook_binary().replace("ansible-playbook", "ansible-inventory")
    except PlaybookError as e:
        raise FleetError(str(e)) from e
    done = subprocess.run([binary, "-i", str(path), "--list"], env=ansible_env(), cwd=repo_root(),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise FleetError(f"ansible-inventory could not read {path}: {done.stderr.strip()[-400:]}")
    return parse_inventory_json(json.loads(done.stdout))


def parse_inventory_json(data: Mapping[str, Any]) -> Inventory:
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    hosts: dict[str, Host] = {}

    def walk(group: str, seen: tuple[str, ...] = ()) -> list[str]:
        body = data.get(group) or {}
        members = list(body.get("hosts") or [])
        for child in body.get("children") or []:
            if child not in seen:
                members += walk(child, (*seen, group))
        return members

    for group in (g for g in data if g != "_meta"):
        for name in walk(group):
            hosts.setdefault(name, Host(name, dict(hostvars.get(name) or {})))
            if group not in hosts[name].groups:
                hosts[name].groups.append(group)
    # Keep the inventory's host order (the canary is the first vlm host), which `--list` gives per group.
    return Inventory(hosts)

"""The fleet's Ansible inventory (YAML): groups `vlm` and `lb`, every connection variable on every host, so
Ansible, testinfra (`ansible://`) and Fabric read it as is, with no group_vars beside it."""

from __future__ import annotations

from pathlib import Path

import yaml

from ops.staging.sshkeys import COMMON_ARGS
from ops.staging.state import FleetState

GROUPS = ("vlm", "lb")


def host_vars(ip: str, kind: str, key: Path) -> dict:
    return {
        "ansible_host": ip,
        "ansible_user": "deploy",
        "ansible_ssh_private_key_file": str(key),
        "ansible_ssh_common_args": COMMON_ARGS,
        "ansible_python_interpreter": "/usr/bin/python3",
        "vlfleet_staging_kind": kind,
    }


def build(state: FleetState, key: Path) -> dict:
    children: dict[str, dict] = {g: {"hosts": {}} for g in GROUPS}
    for name in sorted(state.hosts, key=_host_order):
        rec = state.hosts[name]
        for group in rec.groups:
            children[group]["hosts"][name] = host_vars(rec.ip, rec.kind, key)
    # The load balancer is another host, so the service binds each host's fleet address, not loopback.
    children["vlm"]["vars"] = {"vlm_service_host": "{{ ansible_host }}"}
    return {"all": {"vars": {"vlfleet_staging_fleet": state.name}, "children": children}}


def _host_order(name: str) -> tuple[int, int]:
    # c1, c2, ..., vm1, ..., lb1: containers, VMs, then the load balancer, each numerically.
    prefix = name.rstrip("0123456789")
    return ({"c": 0, "vm": 1, "lb": 2}.get(prefix, 3), int(name[len(prefix):] or 0))


def write(path: Path, state: FleetState, key: Path) -> Path:
    header = f"# vlfleet staging fleet {state.name!r} (subnet {state.subnet}); written by `vlfleet staging.up`\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(header + yaml.safe_dump(build(state, key), sort_keys=False, default_flow_style=False, width=1000))
    tmp.replace(path)
    return path


def hosts_of(path: Path) -> dict[str, dict]:
    """host name -> its variables (with `groups`), read back from an inventory this module wrote."""
    data = yaml.safe_load(path.read_text()) or {}
    hosts: dict[str, dict] = {}
    for group, body in (data.get("all", {}).get("children") or {}).items():
        for name, hvars in ((body or {}).get("hosts") or {}).items():
            hosts.setdefault(name, {**hvars, "groups": []})["groups"].append(group)
    return hosts

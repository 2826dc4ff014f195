"""The staging inventory: groups, per-host connection variables, and that Ansible itself parses it that way."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.staging import inventory
from ops.staging.state import FleetState, HostRecord

KEY = Path("/var/tmp/fleet/id_ed25519")


def _state() -> FleetState:
    st = FleetState("t", "10.250.77.0/24", "vlbabc")
    for name, kind, ip, groups in [
        ("lb1", "container", "10.250.77.10", ["lb"]),
        ("vm1", "vm", "10.250.77.101", ["vlm"]),
        ("c2", "container", "10.250.77.12", ["vlm"]),
        ("c10", "container", "10.250.77.20", ["vlm"]),
        ("c1", "container", "10.250.77.11", ["vlm"]),
    ]:
        st.hosts[name] = HostRecord(name, kind, ip, groups)
    return st


def test_groups_and_host_order():
    data = inventory.build(_state(), KEY)
    children = data["all"]["children"]
    assert list(children["vlm"]["hosts"]) == ["c1", "c2", "c10", "vm1"]
    assert list(children["lb"]["hosts"]) == ["lb1"]


@pytest.mark.parametrize("host", ["c1", "vm1", "lb1"])
def test_every_host_carries_its_connection_vars(host):
    data = inventory.build(_state(), KEY)
    merged = {**data["all"]["children"]["vlm"]["hosts"], **data["all"]["children"]["lb"]["hosts"]}
    hv = merged[host]
    assert hv["ansible_user"] == "deploy"
    assert hv["ansible_ssh_private_key_file"] == str(KEY)
    assert "StrictHostKeyChecking=no" in hv["ansible_ssh_common_args"]
    assert "UserKnownHostsFile=/dev/null" in hv["ansible_ssh_common_args"]
    assert hv["ansible_python_interpreter"] == "/usr/bin/python3"
    assert hv["vlfleet_staging_kind"] == ("vm" if host == "vm1" else "container")
    assert hv["ansible_host"] == _state().hosts[host].ip


def test_written_file_round_trips(tmp_path):
    path = inventory.write(tmp_path / "inventory.yml", _state(), KEY)
    assert path.read_text().startswith("# vlfleet staging fleet 't'")
    hosts = inventory.hosts_of(path)
    assert hosts["lb1"]["groups"] == ["lb"]
    assert hosts["vm1"]["ansible_host"] == "10.250.77.101"
    assert not list(tmp_path.glob("*.tmp"))


def test_ansible_reads_it_as_written(tmp_path):
    ansible_inventory = Path(sys.executable).parent / "ansible-inventory"
    if not ansible_inventory.exists():
        ansible_inventory = Path(shutil.which("ansible-inventory") or "ansible-inventory")
    path = inventory.write(tmp_path / "inventory.yml", _state(), KEY)
    out = subprocess.run([str(ansible_inventory), "-i", str(path), "--list"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    data = json.loads(out)
    assert sorted(data["vlm"]["hosts"]) == ["c1", "c10", "c2", "vm1"]
    assert data["lb"]["hosts"] == ["lb1"]
    hv = data["_meta"]["hostvars"]["vm1"]
    assert hv["ansible_host"] == "10.250.77.101"
    assert hv["ansible_ssh_common_args"].split() == inventory.COMMON_ARGS.split()

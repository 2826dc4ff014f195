"""NUMA on a real kernel: the standard fleet's vm1 boots with two NUMA nodes (qemu -numa, one vCPU and half the RAM
each), like a two-socket server. The launcher keeps the service on one node and binds its memory there with
numactl (installed by os_packages); the checklist's NUMA-LOCAL check says so; containers follow the controller's
own node count. The check's verdict on the healthy fleet is asserted in test_preflight.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.hostcmd import service_pids
from tests.e2e.hostcmd import sudo as _sudo

pytestmark = [pytest.mark.fleet, pytest.mark.slow]


@pytest.fixture(scope="module")
def hosts(staging_fleet) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return {n: h for n, h in hosts_of(Path(staging_fleet.inventory_path)).items() if "vlm" in h["groups"]}


def test_vm_has_two_nodes_and_service_is_bound_to_the_plans_node(converged_inventory, hosts):
    vm1 = hosts["vm1"]
    nodes = sorted(_sudo(vm1, "ls -d /sys/devices/system/node/node[0-9]*").split())
    assert [Path(n).name for n in nodes] == ["node0", "node1"], nodes
    plan = json.loads(_sudo(vm1, "cat /run/vlfleet/cpu-plan.json"))
    node_cpus = _sudo(vm1, f"cat /sys/devices/system/node/node{plan['node']}/cpulist").strip()
    assert plan["membind"] == plan["node"], plan  # numactl is there (os_packages), so memory follows the CPUs
    for pid in service_pids(vm1):
        maps = _sudo(vm1, f"cat /proc/{pid}/numa_maps")
        policies = {line.split()[1] for line in maps.splitlines() if len(line.split()) > 1}
        # bind:N from numactl; "local" where the runtime's allocator set a mapping's own policy (same node here)
        assert f"bind:{plan['node']}" in policies and policies <= {f"bind:{plan['node']}", "local"}, \
            f"pid {pid}: {policies}"
        status = _sudo(vm1, f"cat /proc/{pid}/status")
        allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)
        assert allowed == node_cpus, f"pid {pid} runs on {allowed}, node {plan['node']} has {node_cpus}"

"""NUMA: the staging VM's node layout (qemu -numa), what the host probe reads, and the checklist's NUMA-LOCAL
verdict on it. The multi-node case on a real kernel is tests/e2e/test_numa.py (a two-node staging VM)."""

from __future__ import annotations

import json
import os

import pytest

from ops.host import probe
from ops.preflight.test_checklist import test_service_stays_on_one_numa_node as numa_local
from ops.staging.vms import numa_argv


def _facts(nodes: dict[str, str], procs: dict[str, tuple[list[str], dict[str, int]]]) -> dict[str, str]:
    return {"numa": json.dumps({"nodes": nodes, "processes": {
        pid: {"cpus": cpus, "policies": policies} for pid, (cpus, policies) in procs.items()}})}


def _verdict(facts: dict[str, str]) -> str:
    found = {}
    numa_local(facts, lambda key, value: found.__setitem__(key, value))
    return found["found"]


def test_numa_argv_splits_cpus_and_memory():
    assert numa_argv(3072, 2, 1) == []
    argv = numa_argv(3000, 3, 2)
    assert argv == ["-object", "memory-backend-ram,id=mem0,size=1500M", "-numa", "node,nodeid=0,cpus=0-0,memdev=mem0",
                    "-object", "memory-backend-ram,id=mem1,size=1500M", "-numa", "node,nodeid=1,cpus=1-2,memdev=mem1"]
    with pytest.raises(ValueError, match="need at least 4 vCPUs"):
        numa_argv(4096, 2, 4)


def test_probe_reads_this_process():
    got = json.loads(probe._numa(os.getpid()))
    assert got["nodes"] and all(cpus for cpus in got["nodes"].values())
    me = got["processes"][str(os.getpid())]
    allowed = set().union(*(range(int(a), int(b or a) + 1) for part in me["cpus"] for a, _, b in
                            (r.partition("-") for r in part.split(","))))
    assert allowed == os.sched_getaffinity(0)
    assert sum(me["policies"].values()) > 10  # one line per mapping: code, heap, stack, libraries


def test_one_node_is_not_applicable():
    with pytest.raises(pytest.skip.Exception, match="1 NUMA node"):
        _verdict(_facts({"0": "0-3"}, {"10": (["0-3"], {"default": 40})}))


def test_two_nodes_pinned_and_bound_passes():
    found = _verdict(_facts({"0": "0-1", "1": "2-3"},
                            {"10": (["2-3"], {"bind:1": 30}), "11": (["2", "3"], {"bind:1": 50, "local": 4})}))
    assert found == "node 1 of 2 (CPUs [2, 3]); 2 process(es), memory bind:1 on 80 mappings, local on 4 mappings"


@pytest.mark.parametrize(("procs", "message"), [
    ({"10": (["0-3"], {"bind:0": 30})}, r"CPUs \[0, 1, 2, 3\], which span NUMA nodes \[0, 1\]"),
    ({"10": (["0-1"], {"default": 30})}, r"not bound to it \(bind:0\): pid 10: \{'default': 30\}"),
    ({"10": (["0-1"], {"bind:0": 30}), "11": (["0"], {"bind:1": 2})}, r"pid 11: \{'bind:1': 2\}"),
    ({"10": (["0-1"], {"local": 30})}, r"no mapping is bound to node 0 \(bind:0\): was the service started through"),
])
def test_two_nodes_spread_or_unbound_fails(procs, message):
    with pytest.raises(AssertionError, match=message):
        _verdict(_facts({"0": "0-1", "1": "2-3"}, procs))


def test_no_process_fails():
    with pytest.raises(AssertionError, match="no service process"):
        _verdict(_facts({"0": "0", "1": "1"}, {}))

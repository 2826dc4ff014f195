"""The CPU-pinning launcher: plans from fake sysfs trees, and one real exec on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.launcher import (
    LaunchError,
    build_command,
    format_cpu_list,
    host_nodes,
    make_plan,
    parse_cpu_list,
    plan_file,
    read_topology,
)

REPO = Path(__file__).resolve().parents[2]


def fake_sysfs(root: Path, nodes: dict[int, list[tuple[int, int, int]]]) -> Path:
    """Build a sysfs tree: {node: [(cpu, package, core), ...]}; siblings = CPUs sharing (package, core)."""
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpus in nodes.values():
        for cpu, package, core in cpus:
            by_core.setdefault((package, core), []).append(cpu)
    for node, cpus in nodes.items():
        node_dir = root / "devices/system/node" / f"node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(format_cpu_list(c for c, _, _ in cpus) + "\n")
        for cpu, package, core in cpus:
            topo = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            (topo / "core_id").write_text(f"{core}\n")
            (topo / "physical_package_id").write_text(f"{package}\n")
            (topo / "thread_siblings_list").write_text(format_cpu_list(by_core[(package, core)]) + "\n")
    return root


@pytest.fixture
def two_socket_smt(tmp_path: Path) -> Path:
    # 2 sockets x 4 cores x 2 threads, Linux-style numbering: cpu N and N+8 are siblings.
    nodes: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
    for package in (0, 1):
        for core in range(4):
            first = package * 4 + core
            nodes[package] += [(first, package, core), (first + 8, package, core)]
    return fake_sysfs(tmp_path, nodes)


def plan_for(sysfs: Path, allowed: set[int], **kw):
    return make_plan(allowed, read_topology(sysfs, allowed), host_nodes(sysfs), **kw)


def test_cpu_list_round_trip():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")
    with pytest.raises(ValueError):
        parse_cpu_list("a")


def test_one_thread_per_core_on_one_node(two_socket_smt: Path):
    plan = plan_for(two_socket_smt, set(range(16)))
    assert plan.cpus == (0, 1, 2, 3)  # node 0, the first thread of each core; siblings 8-11 stay idle
    assert plan.node == 0
    assert plan.threads == 4
    assert plan.host_nodes == (0, 1)
    assert plan.membind is None  # numactl not offered
    assert any("numactl is not installed" in r for r in plan.reasons)


def test_numactl_membind_when_several_nodes(two_socket_smt: Path):
    plan = plan_for(two_socket_smt, set(range(16)), numactl=True)
    assert plan.membind == 0
    assert build_command(plan, ["py", "-m", "service"], "/usr/bin/numactl") == [
        "/usr/bin/numactl", "--membind=0", "--", "py", "-m", "service"]


def test_node_with_more_allowed_cores_wins(two_socket_smt: Path):
    # Only one core of node 0 is allowed, three of node 1.
    plan = plan_for(two_socket_smt, {0, 8, 5, 6, 7, 13})
    assert plan.node == 1
    assert plan.cpus == (5, 6, 7)
    assert plan.threads == 3


def test_sibling_only_mask_keeps_one_per_core(two_socket_smt: Path):
    # The mask holds only the second threads of node 0's cores: still one per core.
    plan = plan_for(two_socket_smt, {8, 9, 10, 11})
    assert plan.cpus == (8, 9, 10, 11)


def test_override_narrows_the_mask(two_socket_smt: Path):
    plan = plan_for(two_socket_smt, set(range(16)), override="1-2,9")
    assert plan.cpus == (1, 2)  # 9 is 1's sibling
    assert plan.allowed == (1, 2, 9)


def test_override_outside_mask_is_a_clear_error(two_socket_smt: Path):
    with pytest.raises(LaunchError, match=r"VLFLEET_CPUS='12-13' shares no CPU .*0-3"):
        plan_for(two_socket_smt, {0, 1, 2, 3}, override="12-13")
    with pytest.raises(LaunchError, match="not a CPU list"):
        plan_for(two_socket_smt, {0}, override="zero")


def test_explicit_thread_count_is_kept(two_socket_smt: Path):
    plan = plan_for(two_socket_smt, set(range(16)), threads=2)
    assert plan.threads == 2
    assert len(plan.cpus) == 4


def test_missing_topology_counts_each_cpu_as_a_core(tmp_path: Path):
    plan = plan_for(tmp_path, {0, 1, 2})  # empty sysfs: no node, no topology files
    assert plan.cpus == (0, 1, 2)
    assert plan.host_nodes == (0,)


def test_plan_file_location():
    assert plan_file({"VLFLEET_CPU_PLAN_FILE": "/x/p.json"}) == Path("/x/p.json")
    assert plan_file({"RUNTIME_DIRECTORY": "/run/vlfleet:/run/other"}) == Path("/run/vlfleet/cpu-plan.json")
    assert plan_file({}) == Path("/run/vlfleet/cpu-plan.json")


def _run_launcher(tmp_path: Path, env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("VLFLEET_")}
    full_env = {**inherited, "PYTHONPATH": str(REPO), "VLFLEET_CPU_PLAN_FILE": str(tmp_path / "plan.json"), **env}
    return subprocess.run([sys.executable, "-m", "service.launcher", "--", *cmd], env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_real_exec_pins_and_sets_threads(tmp_path: Path):
    # The launcher pins itself, then execs the target, which inherits mask and environment.
    probe = "import os, json; print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['VLFLEET_THREADS'], " \
            "os.environ['OMP_NUM_THREADS']]))"
    first = min(os.sched_getaffinity(0))
    done = _run_launcher(tmp_path, {"VLFLEET_CPUS": str(first)}, sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    affinity, threads, omp = json.loads(done.stdout)
    assert affinity == [first]
    assert threads == omp == "1"
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["cpus"] == [first]
    log = json.loads(done.stderr.strip().splitlines()[-1])
    assert log["event"] == "cpu_plan" and log["plan"]["cpus"] == [first]


def test_real_bad_override_exits_with_message(tmp_path: Path):
    done = _run_launcher(tmp_path, {"VLFLEET_CPUS": "4096"}, sys.executable, "-c", "print('ran')")
    assert done.returncode == 2
    assert "ran" not in done.stdout
    assert "VLFLEET_CPUS='4096' shares no CPU" in done.stderr

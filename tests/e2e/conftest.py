"""Staging fleets shared by every e2e test: brought up once per session, torn down after its last e2e test (package
scope: an idle TCG VM would otherwise take CPU from the integration and unit tests that follow).

`staging_fleet`: 2 nspawn containers (c1, c2) + 1 qemu VM (vm1, two NUMA nodes) in group `vlm`, container lb1 in
group `lb`.
`converged_inventory`: the standard fleet after the session's one site.yml converge, which every module needing a
serving fleet shares (each puts back what it breaks).
`noavx2_fleet`: one VM (vm1) whose CPU lacks AVX2, for the cpu_check role; started only if a test asks for it.
Both reuse a fleet of the same name that is already up (up is idempotent). Set VLFLEET_KEEP_FLEET=1 to keep them
after the session (e.g. to debug with `vlfleet staging.ssh c1 --name e2e`), and VLFLEET_E2E_FLEET to rename them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prereq import require, require_tools

E2E_FLEET = os.environ.get("VLFLEET_E2E_FLEET", "e2e")
# The standard fleet's shape. vm1 has two NUMA nodes (a vCPU and half its RAM each), like a two-socket server:
# the launcher's node choice and the checklist's NUMA-LOCAL check meet a real multi-node kernel (test_numa.py).
STANDARD = {"containers": 2, "vms": 1, "lb": True, "vm_numa_nodes": 2}
KEEP = os.environ.get("VLFLEET_KEEP_FLEET") == "1"
STAGING_TOOLS = ("debootstrap", "systemd-nspawn", "qemu-system-x86_64", "mkfs.ext4", "ip", "ssh", "ssh-keygen")


def require_staging() -> None:
    """Skip (fail under VLFLEET_REQUIRE_ALL=1) on a machine that cannot run staging fleets."""
    require_tools(*STAGING_TOOLS, root=True)
    require(any(Path("/boot").glob("vmlinuz-*")), "needs a kernel in /boot for VM hosts (linux-image-amd64)")


def _fleet(name: str, **kwargs) -> Iterator:
    from ops.staging import fleet
    from ops.staging.system import StagingError

    require_staging()
    try:
        f = fleet.up(name, **kwargs)
    except StagingError as e:
        problems = [] if KEEP else fleet.down(name)
        pytest.fail(f"staging fleet {name!r} did not come up: {e}" + (f"\nleft behind: {problems}" if problems
                                                                        else ""), pytrace=False)
    yield f
    if not KEEP:
        problems = fleet.down(name)
        assert not problems, f"staging fleet {name!r} left objects behind: {problems}"


@pytest.fixture(scope="package")
def staging_fleet():
    """The standard e2e fleet (`ops.staging.fleet.StagingFleet`): c1, c2, vm1 in `vlm`, lb1 in `lb`. The session's
    converge needs the suite's llama.cpp build: on a cold cache it starts now, beside the fleet's bring-up."""
    from tests.e2e.site_vars import runtime_prefetched

    with runtime_prefetched():
        yield from _fleet(E2E_FLEET, **STANDARD)


@pytest.fixture(scope="package")
def noavx2_fleet():
    """A one-VM fleet whose CPU has no AVX2 (qemu `-cpu max,-avx2`), group `vlm`, no lb."""
    from ops.staging.vms import NO_AVX2_CPU

    yield from _fleet(f"{E2E_FLEET}-noavx2", containers=0, vms=1, lb=False, vm_cpu=NO_AVX2_CPU, vm_memory_mb=2048)


@pytest.fixture(scope="package")
def staging_inventory(staging_fleet) -> Path:
    """Path of the e2e fleet's Ansible inventory (for ansible-playbook -i / testinfra ansible://)."""
    return staging_fleet.inventory_path


# --- one converge for every module (tests/e2e/site_vars.py) ---------------------------------------------------
@pytest.fixture(scope="package")
def converged_inventory(staging_fleet, tiny_model: Path) -> Path:
    """The standard e2e fleet, converged with site.yml (once per session)."""
    from tests.e2e.site_vars import converge

    inventory = Path(staging_fleet.inventory_path)
    converge(inventory, tiny_model)
    return inventory


# --- order (the time budget is in tests/budget.py) -------------------------------------------------------------
# The staging checks first (they need no converge), then site.yml's own module (the converge every later module
# shares), then `vlfleet tune` on one host (it puts the host back), then the rest in file order; tests on the
# no-AVX2 fleet last, so that its idle TCG VM, which takes CPU from everything else on a 2-core machine, is up only
# at the end.
FIRST = ("test_staging.py", "test_site.py", "test_tune.py")


def pytest_collection_modifyitems(items):
    slots = [i for i, item in enumerate(items) if "tests/e2e/" in item.nodeid]
    for i, item in zip(slots, sorted((items[i] for i in slots), key=_rank), strict=True):
        items[i] = item


def _rank(item) -> tuple[bool, int]:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    return "noavx2_fleet" in item.fixturenames, FIRST.index(module) if module in FIRST else len(FIRST)

"""CPU-pinning launcher: `python -m service.launcher [-- CMD ...]`, the systemd unit's ExecStart.

It picks one hardware thread per physical core (SMT siblings share a core's execution units, and OpenVINO's
CPU plugin runs best with one inference thread per core), keeps to one NUMA node (memory reads stay local;
decode is bandwidth-bound), pins itself with sched_setaffinity, sets VLFLEET_THREADS and OMP_NUM_THREADS to the
core count, logs the decision as one JSON line, writes it to a plan file the checklist reads, then execs the
service (`python -m service`; the affinity mask and environment survive exec).

Inputs (environment):
  VLFLEET_CPUS            optional core list override, e.g. "0-3,8"; intersected with the inherited affinity.
  VLFLEET_THREADS         a non-zero value is kept as the operator's explicit choice (else set to the core count).
  VLFLEET_CPU_PLAN_FILE   where to write the plan (default $RUNTIME_DIRECTORY/cpu-plan.json, else
                          /run/vlfleet/cpu-plan.json).
numactl, when installed and the host has more than one NUMA node, adds `--membind=<node>`.

Host side: standard library only, Python 3.10.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SYSFS_CPU = "devices/system/cpu"
SYSFS_NODE = "devices/system/node"
DEFAULT_PLAN_FILE = "/run/vlfleet/cpu-plan.json"


class LaunchError(Exception):
    """A configuration the launcher cannot honour; the message says what to change."""


@dataclass(frozen=True)
class Cpu:
    id: int
    package: int
    core: int
    node: int
    siblings: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    cpus: tuple[int, ...]  # the CPUs the service is pinned to: one per physical core
    node: int  # NUMA node they belong to
    threads: int  # VLFLEET_THREADS for the service
    allowed: tuple[int, ...]  # what the launcher was allowed to use (affinity, maybe narrowed by VLFLEET_CPUS)
    host_nodes: tuple[int, ...]  # every NUMA node on the host
    membind: int | None  # node passed to numactl --membind, None when not applied
    reasons: list[str] = field(default_factory=list)  # why the plan looks the way it does (logged)

    def to_json(self) -> dict:
        return asdict(self)


def parse_cpu_list(text: str) -> set[int]:
    """Parse the kernel's CPU list syntax ("0-3,8,10-11"); raise ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi or lo < 0:
                raise ValueError(f"bad range {part!r}")
            cpus.update(range(lo, hi + 1))
        else:
            value = int(part)
            if value < 0:
                raise ValueError(f"bad CPU {part!r}")
            cpus.add(value)
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpu_list, with ranges collapsed ("0-3,8")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_topology(sysfs: Path, cpus: Iterable[int]) -> dict[int, Cpu]:
    """Topology of the given CPUs from sysfs; missing files degrade to "every CPU is its own core on node 0"."""
    node_of: dict[int, int] = {}
    node_root = sysfs / SYSFS_NODE
    if node_root.is_dir():
        for entry in sorted(node_root.glob("node[0-9]*")):
            listing = _read(entry / "cpulist")
            if listing:
                for cpu in parse_cpu_list(listing):
                    node_of[cpu] = int(entry.name[4:])
    result: dict[int, Cpu] = {}
    for cpu in cpus:
        topo = sysfs / SYSFS_CPU / f"cpu{cpu}" / "topology"
        core = _read(topo / "core_id")
        package = _read(topo / "physical_package_id")
        siblings = _read(topo / "thread_siblings_list")
        result[cpu] = Cpu(
            id=cpu,
            package=int(package) if package not in (None, "-1") else 0,
            # Without core_id (some VMs/containers hide topology) a CPU counts as its own core.
            core=int(core) if core is not None else -1 - cpu,
            node=node_of.get(cpu, 0),
            siblings=tuple(sorted(parse_cpu_list(siblings))) if siblings else (cpu,),
        )
    return result


def host_nodes(sysfs: Path) -> tuple[int, ...]:
    node_root = sysfs / SYSFS_NODE
    nodes = sorted(int(p.name[4:]) for p in node_root.glob("node[0-9]*")) if node_root.is_dir() else []
    return tuple(nodes) or (0,)


def make_plan(
    allowed: Iterable[int],
    topology: dict[int, Cpu],
    nodes: Sequence[int] = (0,),
    override: str | None = None,
    threads: int = 0,
    numactl: bool = False,
) -> Plan:
    """Choose the CPUs, node and thread count. Pure: every input is an argument."""
    reasons: list[str] = []
    allowed_set = set(allowed)
    if override:
        try:
            wanted = parse_cpu_list(override)
        except ValueError as e:
            raise LaunchError(
                f"VLFLEET_CPUS={override!r} is not a CPU list ({e}); use the kernel's syntax, e.g. 0-3,8"
            ) from None
        narrowed = allowed_set & wanted
        if not narrowed:
            raise LaunchError(
                f"VLFLEET_CPUS={override!r} shares no CPU with the CPUs this process may use "
                f"({format_cpu_list(allowed_set)}); pick CPUs from that list or unset VLFLEET_CPUS"
            )
        if narrowed != wanted:
            reasons.append(f"VLFLEET_CPUS asks for {format_cpu_list(wanted - narrowed)} outside the affinity mask")
        allowed_set = narrowed
        reasons.append(f"VLFLEET_CPUS={override}")
    if not allowed_set:
        raise LaunchError("the process's CPU affinity mask is empty")

    # Group by node, then by physical core (package, core_id); first allowed CPU of each core represents it.
    per_node: dict[int, dict[tuple[int, int], int]] = {}
    for cpu in sorted(allowed_set):
        info = topology.get(cpu) or Cpu(cpu, 0, -1 - cpu, 0, (cpu,))
        cores = per_node.setdefault(info.node, {})
        cores.setdefault((info.package, info.core), cpu)
    # The node with the most cores wins; ties go to the lowest node id (deterministic across restarts).
    node = min(per_node, key=lambda n: (-len(per_node[n]), n))
    chosen = tuple(sorted(per_node[node].values()))
    if len(per_node) > 1:
        reasons.append(
            f"allowed CPUs span nodes {sorted(per_node)}; kept node {node} ({len(chosen)} cores) for local memory"
        )
    skipped = sorted(c for c in allowed_set if topology.get(c) and c not in chosen and topology[c].node == node)
    if skipped:
        reasons.append(f"SMT siblings left idle: {format_cpu_list(skipped)}")
    if threads > 0:
        reasons.append(f"VLFLEET_THREADS={threads} set explicitly; kept")
    membind = node if (numactl and len(nodes) > 1) else None
    if len(nodes) > 1 and not numactl:
        reasons.append("several NUMA nodes but numactl is not installed: memory placement left to the kernel")
    return Plan(
        cpus=chosen,
        node=node,
        threads=threads if threads > 0 else len(chosen),
        allowed=tuple(sorted(allowed_set)),
        host_nodes=tuple(nodes),
        membind=membind,
        reasons=reasons,
    )


def plan_file(environ: dict[str, str]) -> Path:
    if environ.get("VLFLEET_CPU_PLAN_FILE"):
        return Path(environ["VLFLEET_CPU_PLAN_FILE"])
    runtime = environ.get("RUNTIME_DIRECTORY", "")
    if runtime:
        # systemd passes several directories colon-separated when RuntimeDirectory= lists more than one.
        return Path(runtime.split(":")[0]) / "cpu-plan.json"
    return Path(DEFAULT_PLAN_FILE)


def write_plan(path: Path, plan: Plan) -> None:
    # Write then rename: a reader never sees half a plan.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plan.to_json(), sort_keys=True) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def build_command(plan: Plan, target: Sequence[str], numactl_path: str | None) -> list[str]:
    if plan.membind is not None and numactl_path:
        return [numactl_path, f"--membind={plan.membind}", "--", *target]
    return list(target)


def _log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "logger": "vlfleet.launcher", **fields}, sort_keys=True),
          file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None, sysfs: Path = Path("/sys")) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    target = args or [sys.executable, "-m", "service"]
    environ = dict(os.environ)
    try:
        raw_threads = environ.get("VLFLEET_THREADS", "") or "0"
        try:
            threads = int(raw_threads)
        except ValueError:
            raise LaunchError(
                f"VLFLEET_THREADS={raw_threads!r} is not an integer; set it to 0 (auto) or a count"
            ) from None
        allowed = os.sched_getaffinity(0)
        numactl_path = shutil.which("numactl")
        nodes = host_nodes(sysfs)
        plan = make_plan(allowed, read_topology(sysfs, allowed), nodes, environ.get("VLFLEET_CPUS"),
                         threads, numactl=numactl_path is not None)
    except LaunchError as e:
        _log("launcher_error", error=str(e))
        print(f"vlfleet launcher: {e}", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, plan.cpus)
    os.environ["VLFLEET_THREADS"] = str(plan.threads)
    os.environ["OMP_NUM_THREADS"] = str(plan.threads)
    path = plan_file(environ)
    try:
        write_plan(path, plan)
    except OSError as e:
        # The plan is also in the log line; a read-only plan location must not keep the service down.
        _log("launcher_plan_not_written", path=str(path), error=str(e))
    command = build_command(plan, target, numactl_path)
    _log("cpu_plan", cpus=format_cpu_list(plan.cpus), plan=plan.to_json(), plan_file=str(path), exec=command)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"vlfleet launcher: cannot exec {command[0]}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

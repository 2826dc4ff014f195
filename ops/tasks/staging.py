"""`vlfleet staging.*`: local staging fleets (nspawn containers + qemu VMs) that the playbooks target as is."""

from __future__ import annotations

import os
import sys

from invoke import Exit, task


@task(help={
    "name": "fleet name (default: default); several fleets can run side by side",
    "containers": "number of container service hosts c1..cN (default 2)",
    "vms": "number of VM service hosts vm1..vmN (default 1)",
    "lb": "add the load-balancer container lb1 (default on; --no-lb to leave it out)",
    "suite": "distribution suite of the base image: bookworm (default) or jammy (needs an Ubuntu mirror)",
    "mirror": "apt mirror for debootstrap (default: the one this machine's apt sources use for the suite)",
    "subnet": "IPv4 /24 of the fleet bridge (default 10.250.77.0/24 for `default`, a free 10.250.X.0/24 else)",
    "vm_cpu": "qemu -cpu model of the VMs (default max; `max,-avx2` gives a host without AVX2)",
    "vm_memory": "RAM per VM in MiB (default 3072)",
    "vm_vcpus": "vCPUs per VM (default 2)",
    "vm_disk": "disk size per VM in GiB (default 12, sparse)",
    "vm_numa_nodes": "NUMA nodes per VM, sharing its vCPUs and RAM evenly (default 1; 2 models a two-socket server)",
    "accel": "auto (KVM if a quick probe boots a kernel with it, else TCG), kvm or tcg",
})
def up(c, name="default", containers=2, vms=1, lb=True, suite="bookworm", mirror="", subnet="", vm_cpu="max",
       vm_memory=3072, vm_vcpus=2, vm_disk=12, accel="auto", vm_numa_nodes=1):
    """Bring a staging fleet up (idempotent: running hosts are kept) and write its Ansible inventory."""
    from ops.staging.fleet import up as fleet_up
    from ops.staging.system import StagingError

    try:
        fleet = fleet_up(name, int(containers), int(vms), bool(lb), suite=suite, mirror=mirror,
                         subnet=subnet or None, vm_cpu=vm_cpu, vm_memory_mb=int(vm_memory),
                         vm_vcpus=int(vm_vcpus), vm_disk_gb=int(vm_disk), accel=accel,
                         vm_numa_nodes=int(vm_numa_nodes))
    except StagingError as e:
        raise Exit(f"staging.up: {e}") from e
    for host in fleet.hosts.values():
        print(f"{host.name:5} {host.kind:9} {host.ip:15} groups={','.join(host.groups)}")
    print(f"inventory: {fleet.inventory_path}")
    print(f"try: ansible -i {fleet.inventory_path} all -m ansible.builtin.ping")
    print(f"ssh: vlfleet staging.ssh {next(iter(fleet.hosts))}" + (f" --name {name}" if name != "default" else ""))


@task(help={"name": "fleet name (default: default)"})
def down(c, name="default"):
    """Remove the fleet: processes, mounts, links, namespaces and files it recorded. Exits 1 if anything stays."""
    from ops.staging.fleet import down as fleet_down
    from ops.staging.system import StagingError

    try:
        problems = fleet_down(name)
    except StagingError as e:
        raise Exit(f"staging.down: {e}") from e
    if problems:
        raise Exit("staging.down could not remove:\n  " + "\n  ".join(problems)
                   + f"\nFix the cause and run `vlfleet staging.down --name {name}` again.")
    print(f"fleet {name!r}: nothing left behind")


@task(help={"name": "fleet name (default: all fleets)"})
def status(c, name=""):
    """Show each host of the fleet(s): kind, address, whether its process runs and sshd answers."""
    from ops.staging.fleet import all_fleets
    from ops.staging.fleet import status as fleet_status

    names = [name] if name else all_fleets()
    if not names:
        print("no staging fleet is up (vlfleet staging.up starts one)")
        return
    for n in names:
        st = fleet_status(n)
        if st is None:
            raise Exit(f"staging.status: no fleet named {n!r} (fleets: {', '.join(all_fleets()) or 'none'})")
        print(f"fleet {n}: subnet {st['subnet']}, inventory {st['inventory']}")
        for host, h in st["hosts"].items():
            state = "up" if h["ssh"] else "running, no ssh" if h["running"] else "DOWN"
            extra = f" cpu={h['cpu']} accel={h['accel']}" if h["kind"] == "vm" else ""
            print(f"  {host:5} {h['kind']:9} {h['ip']:15} {state}{extra}")


@task(name="power-cycle", help={
    "host": "host name from the inventory (c1, vm1, lb1, ...)", "name": "fleet name (default: default)",
    "hard": "cut its power now; otherwise wait for the host to power itself off (after `systemctl poweroff` or, "
            "on a VM, `systemctl reboot` inside it)",
    "timeout": "seconds to wait for it to power off (default 180)"})
def power_cycle(c, host, name="default", hard=False, timeout=180):
    """Power a staging host on again with the same disk, network and address (reboot and power-cut drills)."""
    from ops.staging.fleet import power_cycle as cycle
    from ops.staging.system import StagingError

    try:
        cycle(name, host, hard=hard, exit_timeout=float(timeout))
    except StagingError as e:
        raise Exit(f"staging.power-cycle: {e}") from None
    print(f"{host} is booting; `vlfleet staging.status --name {name}` shows when SSH answers")


@task(help={"host": "host name from the inventory (c1, vm1, lb1, ...)", "name": "fleet name (default: default)",
            "command": "run this command instead of an interactive shell"})
def ssh(c, host, name="default", command=""):
    """Open an SSH session as deploy on a staging host (or run one command there)."""
    from ops.staging.fleet import get
    from ops.staging.sshkeys import ssh_argv

    fleet = get(name)
    if fleet is None:
        raise Exit(f"staging.ssh: fleet {name!r} is not up; run `vlfleet staging.up --name {name}` first")
    if host not in fleet.hosts:
        raise Exit(f"staging.ssh: no host {host!r} in fleet {name!r} (hosts: {', '.join(fleet.hosts)})")
    argv = ssh_argv(fleet.hosts[host].ip, fleet.key_path)
    sys.stdout.flush()
    os.execvp(argv[0], [*argv, *([command] if command else [])])


@task(help={
    "name": "fleet name (default: scale); reused when it is already up",
    "hosts": "number of container service hosts c1..cN (default 8; 2-49); the fleet also gets lb1, no VMs",
    "keep": "leave the fleet up afterwards (default: `staging.down` at the end)",
    "fresh": "bring a running fleet of that name down first, so every converge starts from bare hosts",
    "out": "directory for scale-<N>-hosts.json and .md (default: results/scale of this checkout)",
    "converge_timeout": "seconds each site.yml run may take before it is killed (default 3600)",
})
def scale(c, name="scale", hosts=8, keep=False, fresh=False, out="", converge_timeout=3600):
    """Measure an N-host staging fleet: one host's converge vs all N, and a rollout under client load."""
    from ops.staging.scale import ScaleError, run

    try:
        _report, paths = run(name, int(hosts), keep=bool(keep), fresh=bool(fresh), out_dir=out or None,
                             converge_timeout=float(converge_timeout))
    except ScaleError as e:
        raise Exit(f"staging.scale: {e}") from None
    print(f"staging.scale: results in {paths[0]} and {paths[1]}")

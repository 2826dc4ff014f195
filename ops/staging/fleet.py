"""Bring a staging fleet up, down, or report on it.

`up` is idempotent: hosts whose process is alive and whose sshd answers are kept; missing or dead ones are
(re)created, in parallel. `down` removes what state.json recorded and returns what it could not remove.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ops.staging import containers as container_hosts
from ops.staging import inventory, kernel_limits, network, resources
from ops.staging import vms as vm_hosts
from ops.staging.image import ImageSpec, ensure_image
from ops.staging.sshkeys import ensure_key, port_open, wait_for_ssh
from ops.staging.state import FleetState, HostRecord, StateStore, fleet_dir, fleets_dir
from ops.staging.system import StagingError, log, require_root, require_tools

CONTAINER_BOOT_TIMEOUT = 180.0
VM_BOOT_TIMEOUT = 900.0  # TCG: ~1 min to SSH on a quiet 2-core machine, 6+ min with several VMs running
KVM_BOOT_TIMEOUT = 120.0  # a KVM boot that takes longer is hung; fall back to TCG
RUNNING_HOST_SSH_TIMEOUT = 120.0  # a host whose process runs gets this long to answer SSH before it is rebuilt
_CANCEL = threading.Event()  # set on Ctrl-C: boot waits in worker threads stop at their next poll
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")


@dataclass
class StagingFleet:
    name: str
    dir: Path
    subnet: str
    inventory_path: Path
    key_path: Path
    hosts: dict[str, HostRecord] = field(default_factory=dict)

    def group(self, group: str) -> list[HostRecord]:
        return [h for h in self.hosts.values() if group in h.groups]


@dataclass(frozen=True)
class VmOptions:
    cpu: str = "max"
    memory_mb: int = 3072
    vcpus: int = 2
    disk_gb: int = 12
    accel: str = "auto"  # auto | kvm | tcg
    numa_nodes: int = 1


def _state_path(name: str) -> Path:
    return fleet_dir(name) / "state.json"


@contextlib.contextmanager
def _fleet_lock(name: str) -> Iterator[None]:
    d = fleet_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise StagingError(f"fleet name {name!r}: use 1-24 lowercase letters, digits and dashes (e.g. default)")


def _desired_hosts(containers_n: int, vms_n: int, lb: bool) -> list[tuple[str, str, list[str]]]:
    if not 0 <= containers_n <= network.MAX_CONTAINERS:
        raise StagingError(f"--containers must be 0..{network.MAX_CONTAINERS}, got {containers_n}")
    if not 0 <= vms_n <= network.MAX_VMS:
        raise StagingError(f"--vms must be 0..{network.MAX_VMS}, got {vms_n}")
    if containers_n + vms_n + int(lb) == 0:
        raise StagingError("a fleet needs at least one host: pass --containers, --vms or --lb")
    hosts = [(f"c{i}", "container", ["vlm"]) for i in range(1, containers_n + 1)]
    hosts += [(f"vm{i}", "vm", ["vlm"]) for i in range(1, vms_n + 1)]
    if lb:
        hosts.append(("lb1", "container", ["lb"]))
    return hosts


def _other_fleets(name: str) -> list[FleetState]:
    out = []
    for path in sorted(fleets_dir().glob("*/state.json")) if fleets_dir().is_dir() else []:
        if path.parent.name != name:
            store = StateStore.load(path)
            if store:
                out.append(store.state)
    return out


def _host_process(store: StateStore, host: str) -> resources.Resource | None:
    procs = [r for r in store.state.host_resources(host) if r.kind == "process"]
    return procs[-1] if procs else None


def _host_up(store: StateStore, host: str, key: Path) -> bool:
    proc = _host_process(store, host)
    rec = store.state.hosts.get(host)
    if not (proc and rec and resources.process_alive(proc)):
        return False
    # A live host on a busy controller can answer slowly: give it time rather than rebuild a working host.
    try:
        wait_for_ssh(rec.ip, key, RUNNING_HOST_SSH_TIMEOUT, lambda: resources.process_alive(proc), host)
    except StagingError as e:
        log(f"{host}: process runs but {e}; rebuilding it")
        return False
    return True


def _remove_host_resources(store: StateStore, host: str) -> list[str]:
    problems = []
    for res in reversed(store.state.host_resources(host)):
        try:
            resources.remove(res)
            store.forget(res)
        except (OSError, RuntimeError, ValueError) as e:
            problems.append(f"{res.label()}: {e}")
    return problems


def up(name: str = "default", containers: int = 2, vms: int = 1, lb: bool = True, *, suite: str = "bookworm",
       mirror: str = "", subnet: str | None = None, vm_cpu: str = "max", vm_memory_mb: int = 3072,
       vm_vcpus: int = 2, vm_disk_gb: int = 12, accel: str = "auto", vm_numa_nodes: int = 1,
       packages: tuple[str, ...] | None = None) -> StagingFleet:
    """Bring fleet ``name`` up (or complete it) and return it; its inventory is at ``StagingFleet.inventory_path``.

    ``packages``: the base image's package list instead of ``image.PACKAGES`` (e.g. hosts that lack what the roles
    install, for os_packages' install mode)."""
    _check_name(name)
    wanted = _desired_hosts(containers, vms, lb)
    if accel not in ("auto", "kvm", "tcg"):
        raise StagingError(f"accel must be auto, kvm or tcg, got {accel!r}")
    if not 1 <= vm_numa_nodes <= vm_vcpus:
        raise StagingError(f"vm_numa_nodes must be 1..vm_vcpus ({vm_vcpus}): each node needs a vCPU; "
                           f"got {vm_numa_nodes}")
    require_root()
    require_tools("ip", "ssh", "ssh-keygen", "mount", "umount", "chroot")
    if containers or lb:
        require_tools("systemd-nspawn")
        kernel_limits.ensure(log=log)
    if vms:
        require_tools(vm_hosts.QEMU, "mkfs.ext4")
        vm_hosts.guest_kernel()
    vm_opts = VmOptions(vm_cpu, vm_memory_mb, vm_vcpus, vm_disk_gb, accel, vm_numa_nodes)
    t0 = time.monotonic()
    with _fleet_lock(name):
        spec = (ImageSpec(suite, mirror) if packages is None else ImageSpec(suite, mirror, tuple(packages))).resolved()
        store = StateStore.load(_state_path(name))
        if store is None:
            chosen = network.choose_subnet(name, subnet, _other_fleets(name))
            store = StateStore(_state_path(name), FleetState(name, chosen, network.bridge_name(name)))
        else:
            _check_compatible(store.state, spec, subnet)
        extra = sorted(set(store.state.hosts) - {h for h, _, _ in wanted})
        if extra:
            raise StagingError(f"fleet {name!r} also has hosts {', '.join(extra)} that this request does not "
                               f"include; run `vlfleet staging.down --name {name}` first to shrink it")
        store.state.settings = {"suite": spec.suite, "mirror": spec.mirror, "packages": _packages_key(spec),
                                "containers": containers, "vms": vms,
                                "lb": lb, "vm_cpu": vm_cpu, "vm_memory_mb": vm_memory_mb, "vm_vcpus": vm_vcpus,
                                "vm_numa_nodes": vm_numa_nodes}
        store.save()
        if vms:
            _warn_busy(name)
        base = ensure_image(spec)
        fdir = fleet_dir(name)
        key = ensure_key(fdir / "id_ed25519")
        for path in (key, key.with_suffix(".pub")):
            if not any(r.kind == "file" and r.id == str(path) for r in store.state.resources):
                store.record("file", path)
        network.ensure_bridge(store)
        todo = []
        for host, kind, groups in wanted:
            if host in store.state.hosts and _host_up(store, host, key):
                log(f"{host}: already up ({store.state.hosts[host].ip}), kept")
                continue
            problems = _remove_host_resources(store, host)
            if problems:
                raise StagingError(f"{host}: could not clean its previous instance: {'; '.join(problems)}")
            ip = network.host_address(store.state.subnet, host)
            rec = HostRecord(host, kind, ip, groups)
            if kind == "vm":
                rec.mac = network.vm_mac(name, ip)
                rec.cpu = vm_cpu
                rec.accel = "tcg" if accel == "tcg" else "kvm" if accel == "kvm" or vm_hosts.kvm_usable() else "tcg"
            store.set_host(rec)
            todo.append(rec)
        pubkey = key.with_suffix(".pub").read_text()
        errors: dict[str, str] = {}
        if todo:
            log(f"starting {', '.join(r.name for r in todo)} in parallel ...")
            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                futures = {r.name: pool.submit(_bring_up, store, r, base, fdir / "hosts" / r.name, key, pubkey,
                                               vm_opts) for r in todo}
                try:
                    for host, fut in futures.items():
                        try:
                            fut.result()
                        except (StagingError, OSError) as e:
                            errors[host] = str(e)
                except KeyboardInterrupt:
                    # Without this the pool would wait for every boot to time out before Ctrl-C takes effect.
                    _CANCEL.set()
                    log(f"interrupted; `vlfleet staging.down --name {name}` removes what was created")
                    raise
                finally:
                    pool.shutdown(wait=True)
                    _CANCEL.clear()
        inv = fdir / "inventory.yml"
        inventory.write(inv, store.state, key)
        if not any(r.kind == "file" and r.id == str(inv) for r in store.state.resources):
            store.record("file", inv)
        if errors:
            detail = "\n".join(f"  {h}: {msg}" for h, msg in errors.items())
            raise StagingError(f"fleet {name!r}: {len(errors)} host(s) failed to come up:\n{detail}\n"
                               f"Resources stay recorded: `vlfleet staging.down --name {name}` removes them.")
        log(f"fleet {name!r} up in {time.monotonic() - t0:.0f} s; inventory: {inv}")
        return _fleet(store.state)


def _warn_busy(name: str) -> None:
    """Say so when other fleets' VMs already run: TCG guests share the controller's cores and slow each other."""
    running = []
    for other in _other_fleets(name):
        store = StateStore.load(_state_path(other.name))
        if store is None:
            continue
        n = sum(1 for h, rec in other.hosts.items() if rec.kind == "vm"
                and (p := _host_process(store, h)) is not None and resources.process_alive(p))
        if n:
            running.append(f"{other.name} ({n})")
    if running:
        log(f"note: VMs of other fleets are running: {', '.join(running)}; under TCG each takes CPU even idle and "
            f"boots slow down with every one (`vlfleet staging.down --name NAME` frees them)")


def _packages_key(spec: ImageSpec) -> str:
    # The package set alone: a change to the image-building code rebuilds images, but keeps running hosts.
    return hashlib.sha256(" ".join(sorted(set(spec.packages) | set(spec.extra_packages))).encode()).hexdigest()[:12]


def _check_compatible(state: FleetState, spec: ImageSpec, subnet: str | None) -> None:
    old = state.settings
    if state.hosts and (old.get("suite"), old.get("mirror")) != (spec.suite, spec.mirror):
        raise StagingError(f"fleet {state.name!r} runs {old.get('suite')} from {old.get('mirror')}; "
                           f"`vlfleet staging.down --name {state.name}` before switching the image")
    if state.hosts and old.get("packages", _packages_key(spec)) != _packages_key(spec):
        raise StagingError(f"fleet {state.name!r} runs an image with another package set; "
                           f"`vlfleet staging.down --name {state.name}` before switching the image")
    if subnet and network.choose_subnet(state.name, subnet, []) != state.subnet:
        raise StagingError(f"fleet {state.name!r} uses subnet {state.subnet}; down it before changing --subnet")


def _bring_up(store: StateStore, rec: HostRecord, base: Path, host_dir: Path, key: Path, pubkey: str,
              opts: VmOptions) -> None:
    t0 = time.monotonic()
    if rec.kind == "container":
        log(f"{rec.name}: booting container (systemd-nspawn) at {rec.ip} ...")
        container_hosts.start(store, rec, base, host_dir, pubkey)
        try:
            _await_ssh(store, rec, key, CONTAINER_BOOT_TIMEOUT, host_dir)
        except StagingError as e:
            proc = _host_process(store, rec.name)
            if proc is None or resources.process_alive(proc):
                raise
            # Seen on a crowded controller: the container's systemd exits at once on a transient resource
            # shortage (EMFILE from inotify). A container boots in seconds, so one fresh attempt is cheap.
            log(f"{rec.name}: container exited while booting; retrying once ({str(e).splitlines()[0]})")
            problems = _remove_host_resources(store, rec.name)
            if problems:
                raise StagingError(f"{rec.name}: could not clean up for a retry: {'; '.join(problems)}") from e
            container_hosts.start(store, rec, base, host_dir, pubkey)
            _await_ssh(store, rec, key, CONTAINER_BOOT_TIMEOUT, host_dir)
    else:
        log(f"{rec.name}: building disk and booting VM ({rec.accel}, -cpu {rec.cpu}) at {rec.ip} ...")
        vm_hosts.start(store, rec, base, host_dir, pubkey, memory_mb=opts.memory_mb, vcpus=opts.vcpus,
                       disk_gb=opts.disk_gb, numa_nodes=opts.numa_nodes)
        try:
            _await_ssh(store, rec, key, KVM_BOOT_TIMEOUT if rec.accel == "kvm" else VM_BOOT_TIMEOUT, host_dir)
        except StagingError:
            if rec.accel != "kvm":
                raise
            log(f"{rec.name}: KVM boot hung; restarting it under TCG")
            proc = _host_process(store, rec.name)
            if proc:
                resources.remove(proc)
                store.forget(proc)
            rec.accel = "tcg"
            store.set_host(rec)
            tap = network.host_link_name(store.state.name, rec.name)
            vm_hosts.launch(store, rec, host_dir / "disk.img", tap, host_dir, opts.memory_mb, opts.vcpus,
                            opts.numa_nodes)
            _await_ssh(store, rec, key, VM_BOOT_TIMEOUT, host_dir)
    log(f"{rec.name}: SSH up after {time.monotonic() - t0:.0f} s")


def _await_ssh(store: StateStore, rec: HostRecord, key: Path, timeout: float, host_dir: Path) -> None:
    proc = _host_process(store, rec.name)
    what = f"{rec.name} ({'nspawn' if rec.kind == 'container' else 'qemu'})"
    if _CANCEL.is_set():
        raise StagingError(f"{what}: interrupted")
    try:
        wait_for_ssh(rec.ip, key, timeout,
                     lambda: not _CANCEL.is_set() and proc is not None and resources.process_alive(proc), what)
    except StagingError as e:
        raise StagingError(f"{e}\n--- console of {rec.name} (tail) ---\n{vm_hosts.console_tail(host_dir)}") from e


def _fleet(state: FleetState) -> StagingFleet:
    fdir = fleet_dir(state.name)
    return StagingFleet(state.name, fdir, state.subnet, fdir / "inventory.yml", fdir / "id_ed25519", dict(state.hosts))


def get(name: str = "default") -> StagingFleet | None:
    """The recorded fleet ``name`` (whether or not its hosts still run), or None."""
    store = StateStore.load(_state_path(name))
    return _fleet(store.state) if store else None


def down(name: str = "default") -> list[str]:
    """Remove everything fleet ``name`` created. Returns what could not be removed (empty: all gone)."""
    _check_name(name)
    if not _state_path(name).is_file():
        log(f"fleet {name!r} is not up (no state); nothing to remove")
        return []
    require_root()
    t0 = time.monotonic()
    with _fleet_lock(name):
        store = StateStore.load(_state_path(name))
        if store is None:
            log(f"fleet {name!r} is not up (no state); nothing to remove")
            return []
        problems: list[str] = []
        # Hosts shut down in parallel (an nspawn container powers off cleanly in a few seconds).
        procs = [r for r in store.state.resources if r.kind == "process"]
        if procs:
            log(f"stopping {len(procs)} host process(es) ...")
            with ThreadPoolExecutor(max_workers=len(procs)) as pool:
                outcomes = list(pool.map(_try_remove, procs))
            for res, err in zip(procs, outcomes, strict=True):
                if err:
                    problems.append(err)
                else:
                    store.forget(res)
        for res in reversed(list(store.state.resources)):
            err = _try_remove(res)
            if err:
                problems.append(err)
            else:
                store.forget(res)
        if problems:
            log(f"fleet {name!r}: {len(problems)} object(s) could not be removed; state kept for a retry")
            return problems
        store.path.unlink(missing_ok=True)
        shutil.rmtree(fleet_dir(name), ignore_errors=True)
    (fleets_dir() / f".{name}.lock").unlink(missing_ok=True)
    log(f"fleet {name!r} down in {time.monotonic() - t0:.0f} s")
    return []


def power_cycle(name: str, host: str, *, hard: bool = False, exit_timeout: float = 180.0) -> float:
    """Start a staging host again on the same root/disk, network and argv, as a power button would.

    ``hard``: cut its power now (the process is stopped; a VM loses what it had not written). Otherwise wait up to
    ``exit_timeout`` s for the host to power itself off first: qemu runs with -no-reboot, so a guest
    `systemctl reboot` ends its process, and an nspawn container ends on poweroff. Returns the seconds until the old
    process was gone. Waiting for SSH afterwards is the caller's choice (boot takes minutes on TCG).
    """
    _check_name(name)
    require_root()
    started = time.monotonic()
    with _fleet_lock(name):
        store = StateStore.load(_state_path(name))
        if store is None:
            raise StagingError(f"fleet {name!r} is not up; run `vlfleet staging.up --name {name}` first")
        if host not in store.state.hosts:
            raise StagingError(f"no host {host!r} in fleet {name!r} (hosts: {', '.join(store.state.hosts)})")
        proc = _host_process(store, host)
        if proc is None or "argv" not in proc.extra:
            raise StagingError(f"{host}: no recorded process to start again; run `vlfleet staging.up --name {name}`")
        if hard:
            resources.remove(proc)
        deadline = started + exit_timeout
        while resources.process_alive(proc):  # bounded by exit_timeout
            if time.monotonic() > deadline:
                raise StagingError(f"{host}: still running {exit_timeout:.0f} s after it was asked to power off; "
                                   f"pass --hard to cut its power")
            time.sleep(1)
        waited = time.monotonic() - started
        resources.reap(int(proc.id))
        store.forget(proc)
        # Where the process's own output went: "out" when it differs from the console log (qemu), else the log.
        out = Path(proc.extra.get("out") or proc.extra.get("log") or fleet_dir(name) / f"{host}.out")
        new, start_time = resources.spawn(proc.extra["argv"], out, append=True)
        if not start_time:
            raise StagingError(f"{host}: {proc.extra['argv'][0]} exited at once; see {out}")
        store.record("process", new.pid, host, start_time=start_time, argv=proc.extra["argv"],
                     log=proc.extra.get("log"), out=str(out))
    log(f"{host}: powered on again ({waited:.0f} s until the old process was gone)")
    return waited


def _try_remove(res: resources.Resource) -> str:
    try:
        resources.remove(res)
    except (OSError, RuntimeError, ValueError) as e:
        return f"{res.label()}: {e}"
    return ""


def status(name: str = "default") -> dict | None:
    """Per-host state of fleet ``name`` (process alive, sshd answering), or None when it is not up."""
    store = StateStore.load(_state_path(name))
    if store is None:
        return None
    hosts = {}
    for host, rec in store.state.hosts.items():
        proc = _host_process(store, host)
        alive = bool(proc and resources.process_alive(proc))
        hosts[host] = {"kind": rec.kind, "ip": rec.ip, "groups": rec.groups, "running": alive,
                       "ssh": alive and port_open(rec.ip), "pid": int(proc.id) if proc else None,
                       **({"cpu": rec.cpu, "accel": rec.accel} if rec.kind == "vm" else {})}
    return {"name": name, "subnet": store.state.subnet, "bridge": store.state.bridge,
            "inventory": str(fleet_dir(name) / "inventory.yml"), "key": str(fleet_dir(name) / "id_ed25519"),
            "hosts": hosts}


def all_fleets() -> list[str]:
    d = fleets_dir()
    return sorted(p.parent.name for p in d.glob("*/state.json")) if d.is_dir() else []

"""VM hosts: qemu with the controller's Debian kernel, an ext4 disk made from the base image (`mkfs.ext4 -d`),
and a tap on the fleet bridge with a static address that a networkd file (matched by MAC) sets inside.

A real kernel is what containers lack: swap, sysctl and CPU models work here. Nested KVM is broken on the
machines this was built on, so KVM is used only if a quick probe boots a kernel with it; otherwise TCG.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from ops.paths import cache_root
from ops.staging import network
from ops.staging.containers import overlay_root
from ops.staging.hostfs import personalise
from ops.staging.resources import remove, spawn
from ops.staging.state import HostRecord, StateStore
from ops.staging.system import StagingError, log, require_tools, run

QEMU = "qemu-system-x86_64"
GUEST_DIR = Path(__file__).parent / "guest"
ZIPCODE_FILES = ("vlfleet_zipcode.py", "vlfleet_zipcode.pth")  # the .pth imports the module at start
NO_AVX2_CPU = "max,-avx2"  # TCG's "max" has AVX2 but no AVX-512; dropping avx2 gives a host the cpu_check rejects
# Module trees no VM needs; the rest lets udev and modprobe work after the initrd hands over.
# Wireless and kvm are left out on purpose: udev would load them at every boot, which is slow under TCG.
_SKIP_MODULES = ("kernel/drivers/gpu", "kernel/drivers/net/wireless", "kernel/drivers/media", "kernel/sound",
                 "kernel/drivers/infiniband", "kernel/drivers/staging", "kernel/drivers/bluetooth",
                 "kernel/net/wireless", "kernel/net/mac80211", "kernel/net/bluetooth", "kernel/arch/x86/kvm")


def guest_kernel() -> tuple[Path, Path, str]:
    """(vmlinuz, initrd, version) of the newest Debian kernel in the controller's /boot."""
    found = []
    for vmlinuz in Path("/boot").glob("vmlinuz-*"):
        version = vmlinuz.name[len("vmlinuz-"):]
        initrd = Path("/boot") / f"initrd.img-{version}"
        if initrd.is_file() and os.access(vmlinuz, os.R_OK):
            found.append((tuple(int(x) for x in re.findall(r"\d+", version)[:4]), vmlinuz, initrd, version))
    if not found:
        raise StagingError("no kernel with initrd in /boot for VM hosts: `apt-get install linux-image-amd64`")
    _, vmlinuz, initrd, version = max(found)
    return vmlinuz, initrd, version


def kvm_usable(timeout: float = 20) -> bool:
    """Whether qemu can run a kernel under KVM here: boot the guest kernel without root fs and expect its panic.

    Cached per (kernel, qemu, CPU) because a broken nested KVM often hangs rather than failing fast.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    vmlinuz, _, version = guest_kernel()
    qemu_version = run([QEMU, "--version"]).splitlines()[0]
    cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    key = hashlib.sha256(json.dumps([version, qemu_version, cpu]).encode()).hexdigest()[:12]
    cache = cache_root() / "staging" / f"kvm-probe-{key}.json"
    if cache.is_file():
        return bool(json.loads(cache.read_text())["kvm"])
    log("probing KVM (one-off, up to 20 s) ...")
    argv = [QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults", "-display", "none",
            "-serial", "stdio", "-no-reboot", "-kernel", str(vmlinuz), "-append", "console=ttyS0 panic=-1"]
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL).stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
    ok = b"VFS: Unable to mount root" in out or b"Kernel panic" in out
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"kvm": ok, "kernel": version, "qemu": qemu_version}) + "\n")
    log(f"KVM {'works' if ok else 'is not usable here (nested?)'}: VMs use {'kvm' if ok else 'tcg'}")
    return ok


def build_disk(store: StateStore, rec: HostRecord, base: Path, host_dir: Path, pubkey: str, size_gb: int) -> Path:
    """The VM's raw ext4 disk: base image + this host's files + kernel modules, made with `mkfs.ext4 -d`."""
    _, _, version = guest_kernel()
    root = overlay_root(store, rec.name, base, host_dir)
    personalise(root, rec.name, pubkey)
    install_zipcode_cache(root)
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    netdir = root / "etc/systemd/network"
    netdir.mkdir(parents=True, exist_ok=True)
    (netdir / "10-vlfleet.network").write_text(
        f"[Match]\nMACAddress={rec.mac}\n\n[Network]\nAddress={rec.ip}/24\n"
        f"Gateway={network.gateway(store.state.subnet)}\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n"
    )
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "systemd-networkd.service"
    if not link.is_symlink():
        link.symlink_to("/lib/systemd/system/systemd-networkd.service")
    modules = Path("/lib/modules") / version
    if modules.is_dir():
        dest = root / "lib/modules" / version
        shutil.copytree(modules, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=lambda d, names: [n for n in names if
                                                 any(str(Path(d, n)).endswith(s) for s in _SKIP_MODULES)])
    disk = host_dir / "disk.img"
    store.record("file", disk, rec.name)
    run(["mkfs.ext4", "-q", "-F", "-L", "vlfleet-root", "-d", str(root), str(disk), f"{size_gb}G"], timeout=900)
    # The overlay was only the source of the disk: unmount it and drop its upper layer now.
    for res in [r for r in store.state.host_resources(rec.name) if r.kind == "mount"]:
        remove(res)
        store.forget(res)
    shutil.rmtree(host_dir / "upper", ignore_errors=True)
    shutil.rmtree(host_dir / "work", ignore_errors=True)
    return disk


def install_zipcode_cache(root: Path) -> None:
    """Put ops/staging/guest/vlfleet_zipcode.py and the .pth that loads it into the system Python's site-packages
    (Ansible tasks and the host program run there): under TCG, compiling each task's zipped sources costs seconds."""
    site = root / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    for name in ZIPCODE_FILES:
        shutil.copyfile(GUEST_DIR / name, site / name)


def numa_argv(memory_mb: int, vcpus: int, nodes: int) -> list[str]:
    """qemu arguments for ``nodes`` NUMA nodes sharing the VM's vCPUs and memory evenly (the last takes what does
    not divide): a multi-socket server in miniature, for the launcher's node choice and the checklist's NUMA check."""
    if nodes <= 1:
        return []
    if nodes > vcpus:
        raise ValueError(f"{nodes} NUMA nodes need at least {nodes} vCPUs, the VM has {vcpus}")
    argv: list[str] = []
    cpus, mem = vcpus // nodes, memory_mb // nodes
    for n in range(nodes):
        last = n == nodes - 1
        first_cpu, last_cpu = n * cpus, (vcpus if last else (n + 1) * cpus) - 1
        size = memory_mb - mem * (nodes - 1) if last else mem
        argv += ["-object", f"memory-backend-ram,id=mem{n},size={size}M",
                 "-numa", f"node,nodeid={n},cpus={first_cpu}-{last_cpu},memdev=mem{n}"]
    return argv


def qemu_argv(rec: HostRecord, disk: Path, tap: str, console: Path, memory_mb: int, vcpus: int,
              numa_nodes: int = 1) -> list[str]:
    vmlinuz, initrd, _ = guest_kernel()
    accel = "kvm" if rec.accel == "kvm" else "tcg,thread=multi"
    return [
        QEMU, "-name", rec.name, "-machine", "q35", "-accel", accel, "-cpu", rec.cpu,
        "-smp", str(vcpus), "-m", str(memory_mb), "-nodefaults", "-display", "none", "-no-reboot",
        "-kernel", str(vmlinuz), "-initrd", str(initrd),
        # tsc=reliable: under TCG the guest otherwise marks its TSCs "unsynchronized" and times itself with HPET,
        # every read of which is an emulated MMIO access (the TSC is a cheap helper call).
        "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=-1 tsc=reliable",
        "-drive", f"file={disk},if=virtio,format=raw",
        "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac={rec.mac}",
        "-object", "rng-random,filename=/dev/urandom,id=rng0", "-device", "virtio-rng-pci,rng=rng0",
        "-serial", f"file:{console}", "-monitor", "none", *numa_argv(memory_mb, vcpus, numa_nodes),
    ]


def start(store: StateStore, rec: HostRecord, base: Path, host_dir: Path, pubkey: str, *,
          memory_mb: int, vcpus: int, disk_gb: int, numa_nodes: int = 1) -> None:
    """Create VM ``rec``'s disk and tap and start qemu; SSH readiness is awaited by the caller."""
    require_tools(QEMU, "mkfs.ext4")
    host_dir.mkdir(parents=True, exist_ok=True)
    store.record("dir", host_dir, rec.name)
    disk = host_dir / "disk.img"
    if not disk.is_file():
        disk = build_disk(store, rec, base, host_dir, pubkey, disk_gb)
    tap = network.create_tap(store, rec.name)
    launch(store, rec, disk, tap, host_dir, memory_mb, vcpus, numa_nodes)


def launch(store: StateStore, rec: HostRecord, disk: Path, tap: str, host_dir: Path, memory_mb: int,
           vcpus: int, numa_nodes: int = 1) -> None:
    console = host_dir / "console.log"
    argv = qemu_argv(rec, disk, tap, console, memory_mb, vcpus, numa_nodes)
    errlog = host_dir / "qemu.log"
    proc, start_time = spawn(argv, errlog)
    if not start_time:
        raise StagingError(f"{rec.name}: qemu exited at once: {errlog.read_text(errors='replace')[-800:]}")
    store.record("process", proc.pid, rec.name, start_time=start_time, argv=argv, log=str(console),
                 out=str(errlog))


def console_tail(host_dir: Path, chars: int = 1500) -> str:
    console = host_dir / "console.log"
    return console.read_text(errors="replace")[-chars:] if console.is_file() else "(no console log)"

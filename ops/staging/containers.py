"""Container hosts: systemd-nspawn booting systemd on an overlay of the base image, in a network namespace of
their own joined to the fleet bridge."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ops.staging import network
from ops.staging.hostfs import personalise
from ops.staging.resources import spawn
from ops.staging.state import HostRecord, StateStore
from ops.staging.system import StagingError, log, run


def overlay_root(store: StateStore, host: str, base: Path, host_dir: Path) -> Path:
    """Mount base (read-only lower) + a per-host upper at host_dir/root; copy the base if overlayfs is refused."""
    upper, work, root = host_dir / "upper", host_dir / "work", host_dir / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={base},upperdir={upper},workdir={work}"
    res = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(root)],
                         capture_output=True, text=True, timeout=60)
    if res.returncode == 0:
        store.record("mount", root, host)
    else:
        # e.g. the cache is itself on overlayfs (inside a container): a full copy works everywhere.
        log(f"{host}: overlayfs refused ({res.stderr.strip()}); copying the base image instead")
        run(["cp", "-a", "--reflink=auto", f"{base}/.", str(root)], timeout=900)
    return root


def start(store: StateStore, rec: HostRecord, base: Path, host_dir: Path, pubkey: str) -> None:
    """Create and boot container ``rec``; returns once nspawn runs (SSH readiness is awaited by the caller)."""
    host_dir.mkdir(parents=True, exist_ok=True)
    store.record("dir", host_dir, rec.name)
    root = overlay_root(store, rec.name, base, host_dir)
    personalise(root, rec.name, pubkey)
    ns = network.create_netns_veth(store, rec.name, rec.ip)
    console = host_dir / "console.log"
    argv = [
        "systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
        f"--directory={root}", f"--machine={rec.name}", f"--network-namespace-path=/run/netns/{ns}",
        # Files the image already carries must stay as they are (no DNS, our own hostname and timezone).
        "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=read-only",
    ]
    proc, start_time = spawn(argv, console)
    if not start_time:
        raise StagingError(f"{rec.name}: systemd-nspawn exited at once; see {console}")
    store.record("process", proc.pid, rec.name, start_time=start_time, argv=argv, log=str(console))

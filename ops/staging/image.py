"""The staging base image: a debootstrap root filesystem with everything the roles need, cached by content.

Hosts reach no package registry, so every package a role asserts must be baked in here. The cache key covers
suite, mirror, package list and this module's code, so changing any of them builds a new image beside the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ops.paths import cache_root
from ops.staging.system import StagingError, log, require_root, require_tools, run

# What the roles and the checklist expect on a host (asserted present by them, never installed there).
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "udev", "openssh-server", "python3", "python3-venv", "python3-apt",
    "sudo", "iproute2", "iputils-ping", "procps", "curl", "ca-certificates", "nginx-light",
    "libnginx-mod-http-js", "numactl",
    "util-linux", "systemd-timesyncd", "kmod", "netbase", "acl", "rsync", "xz-utils", "less",
)
DEPLOY_USER = "deploy"
DEPLOY_UID = 1000
UBUNTU_SUITES = ("focal", "jammy", "noble")


@dataclass(frozen=True)
class ImageSpec:
    suite: str = "bookworm"
    mirror: str = ""  # empty: read from the controller's apt sources
    packages: tuple[str, ...] = PACKAGES
    extra_packages: tuple[str, ...] = field(default=())

    def resolved(self) -> ImageSpec:
        mirror = self.mirror or default_mirror(self.suite)
        return ImageSpec(self.suite, mirror.rstrip("/"), self.packages, self.extra_packages)

    def key(self) -> str:
        pkgs = sorted(set(self.packages) | set(self.extra_packages))
        blob = json.dumps([self.suite, self.mirror, pkgs, _code_version()], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _code_version() -> str:
    # Only the code that shapes the image's content is in the key: editing anything else keeps the cache.
    src = inspect.getsource(debootstrap_args) + inspect.getsource(_customise)
    return hashlib.sha256(src.encode()).hexdigest()[:12]


def apt_sources(base: Path = Path("/etc/apt")) -> Iterator[tuple[str, list[str]]]:
    """(uri, suites) for every deb source the controller's apt knows, one-line and deb822 formats."""
    files = [base / "sources.list", *sorted((base / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
                    if m:
                        fields[m.group(1).lower()] = m.group(2)
                if "deb" in fields.get("types", "").split():
                    for uri in fields.get("uris", "").split():
                        yield uri, fields.get("suites", "").split()
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(parts) >= 3 and parts[0] == "deb":
                    yield parts[1], [parts[2]]


def default_mirror(suite: str, apt_dir: Path = Path("/etc/apt")) -> str:
    """The first apt source of the controller that serves ``suite`` itself (not -security or -updates)."""
    for uri, suites in apt_sources(apt_dir):
        if suite in suites and uri.startswith(("http://", "https://")):
            return uri
    # A Debian controller can bootstrap another Debian suite from its own Debian mirror.
    if suite not in UBUNTU_SUITES:
        for uri, _ in apt_sources(apt_dir):
            if uri.rstrip("/").endswith("/debian"):
                return uri
    raise StagingError(
        f"no apt source on this machine serves suite {suite!r}: pass the mirror explicitly "
        f"(e.g. --mirror http://archive.ubuntu.com/ubuntu for jammy)"
    )


def images_dir() -> Path:
    d = cache_root() / "staging" / "images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def image_path(spec: ImageSpec) -> Path:
    """Root filesystem directory of the (resolved) spec's image; it exists once built."""
    return images_dir() / f"{spec.suite}-{spec.key()}" / "rootfs"


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    # Two fleets may be brought up at once; only one of them builds a given image.
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_image(spec: ImageSpec | None = None) -> Path:
    """Return the cached root filesystem for ``spec``, building it first if needed (~1-3 min)."""
    spec = (spec or ImageSpec()).resolved()
    root = image_path(spec)
    if (root.parent / "image.json").is_file():
        return root
    require_root()
    require_tools("debootstrap", "chroot")
    with _build_lock(images_dir() / f".{root.parent.name}.lock"):
        if (root.parent / "image.json").is_file():
            return root
        _build(spec, root)
    return root


def debootstrap_args(spec: ImageSpec, target: Path) -> list[str]:
    pkgs = sorted(set(spec.packages) | set(spec.extra_packages))
    args = ["debootstrap", "--variant=minbase", f"--include={','.join(pkgs)}"]
    if spec.suite in UBUNTU_SUITES:
        # nginx-light and numactl live in universe on Ubuntu.
        args.append("--components=main,universe")
        keyring = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
        if not keyring.is_file():
            raise StagingError(f"{keyring} is missing: `apt-get install ubuntu-keyring` to bootstrap {spec.suite}")
        args.append(f"--keyring={keyring}")
    return [*args, spec.suite, str(target), spec.mirror]


def _build(spec: ImageSpec, root: Path) -> None:
    work = root.parent.with_name(root.parent.name + ".partial")
    if work.exists():
        run(["rm", "-rf", "--one-file-system", str(work)])
    work.mkdir(parents=True)
    target = work / "rootfs"
    log(f"building base image {spec.suite} from {spec.mirror} (debootstrap, a few minutes) ...")
    t0 = time.monotonic()
    try:
        run(debootstrap_args(spec, target), timeout=1800)
    except StagingError as e:
        log_file = target / "debootstrap" / "debootstrap.log"
        tail = log_file.read_text(errors="replace")[-1500:] if log_file.is_file() else ""
        raise StagingError(f"{e}\n--- debootstrap.log (tail) ---\n{tail}") from e
    _customise(target)
    (work / "image.json").write_text(json.dumps({
        "suite": spec.suite, "mirror": spec.mirror,
        "packages": sorted(set(spec.packages) | set(spec.extra_packages)),
        "code": _code_version(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")
    work.rename(root.parent)
    log(f"base image ready in {time.monotonic() - t0:.0f} s: {root}")


def _customise(root: Path) -> None:
    """Make the image look like a production host: deploy user with sudo, no root login, no shared secrets."""
    run(["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", "--uid", str(DEPLOY_UID),
         "--groups", "sudo", DEPLOY_USER])
    run(["chroot", str(root), "passwd", "--lock", "root"])
    sudoers = root / "etc/sudoers.d" / DEPLOY_USER
    sudoers.write_text(f"{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    (root / "etc/ssh/sshd_config.d/vlfleet-staging.conf").write_text(
        "# vlfleet staging: key login only, as on production hosts\n"
        "PermitRootLogin no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\n"
    )
    # Host keys and machine-id are per host (written at host creation); the image must not share them.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    # nginx is baked in for the lb role, which enables it; service hosts must not listen on :80.
    for link in (root / "etc/systemd/system").glob("*.wants/nginx.service"):
        link.unlink()
    # Hosts have no DNS and no registry; a stale copy of the controller's resolv.conf would only cause timeouts.
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("# vlfleet staging hosts have no DNS\n")
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    os.sync()

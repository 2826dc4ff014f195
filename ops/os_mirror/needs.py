"""What the mirror must hold: the packages roles/os_packages installs, read from its per-distribution vars files
(never retyped here), minus what a host's dpkg status says is installed already."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ops.os_mirror import MirrorError
from ops.paths import repo_root


@dataclass(frozen=True)
class Distro:
    """A suite's distribution: the os_packages vars file it maps to and where its archive is signed from."""

    vars_name: str  # roles/os_packages/vars/<vars_name>.yml
    components: tuple[str, ...]
    keyring: str
    keyring_fix: str  # how to get the keyring onto the controller
    pockets: tuple[str, ...] = ()  # suffixes of the suites served beside the release itself (-updates, ...)


_DEBIAN_KEYRING = ("/usr/share/keyrings/debian-archive-keyring.gpg", "`apt-get install debian-archive-keyring`")
# Debian 12 has no ubuntu-keyring; Debian 13's (signed by Debian) installs on it as is.
_UBUNTU_KEYRING = ("/usr/share/keyrings/ubuntu-archive-keyring.gpg",
                   "`apt-get install ubuntu-keyring` (Ubuntu, Debian 13 and later; on Debian 12 install Debian 13's "
                   "ubuntu-keyring .deb, or pass --keyring FILE)")
# Debian's security pocket lives on another host, so a Debian mirror is the release suite alone (as debootstrap
# builds staging images); stock Ubuntu servers run -updates/-security versions, and archive.ubuntu.com has both.
# nginx and numactl are in universe on Ubuntu.
SUITES = {
    "bookworm": Distro("Debian-12", ("main",), *_DEBIAN_KEYRING),
    "jammy": Distro("Ubuntu-22.04", ("main", "universe"), *_UBUNTU_KEYRING, ("-updates", "-security")),
    "noble": Distro("Ubuntu-24.04", ("main", "universe"), *_UBUNTU_KEYRING, ("-updates", "-security")),
}


def distro(suite: str) -> Distro:
    try:
        return SUITES[suite]
    except KeyError:
        raise MirrorError(f"suite {suite!r} is not one the roles support: use one of {', '.join(SUITES)}") from None


def role_names(suite: str, role_dir: Path | None = None) -> dict[str, list[str]]:
    """need -> the packages any one of which satisfies it (the first is the one installed), as os_packages has it."""
    path = (role_dir or repo_root() / "roles" / "os_packages") / "vars" / f"{distro(suite).vars_name}.yml"
    if not path.is_file():
        raise MirrorError(f"{path} is missing: os_packages has no package names for {suite}")
    return yaml.safe_load(path.read_text())["os_packages_names"]


def installed(status_text: str) -> set[str]:
    """Names of the packages a dpkg status file marks installed."""
    names = set()
    for stanza in re.split(r"\n\s*\n", status_text):
        fields = dict(re.findall(r"^(Package|Status):\s*(.+)$", stanza, re.MULTILINE))
        if fields.get("Status", "").split()[-1:] == ["installed"] and "Package" in fields:
            names.add(fields["Package"].strip())
    return names


def wanted(names: dict[str, list[str]], needs: list[str] | None = None, present: set[str] | None = None) -> list[str]:
    """Per need (all by default), the package os_packages would install: its first name, unless one is present."""
    unknown = sorted(set(needs or ()) - set(names))
    if unknown:
        raise MirrorError(f"unknown need(s) {', '.join(unknown)}: choose from {', '.join(names)}")
    present = present or set()
    return sorted({names[n][0] for n in (needs or names) if not present.intersection(names[n])})

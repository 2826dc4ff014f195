"""Air-gapped installs (issue 19): hosts built without python3-venv, nginx (and its JavaScript module) and numactl,
which reach no registry.

With installs off, os_packages stops and names what is missing. With installs on and the controller's mirror set
(`vlfleet os-mirror.build` against the image's dpkg status, served on the fleet's bridge address), a full site.yml
converge installs them from that mirror alone and the hosts serve. A fleet of its own (c1 + lb1, containers), so
the standard fleet keeps its baked-in image.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.e2e.conftest import E2E_FLEET, _fleet
from tests.e2e.hostcmd import ssh as _ssh
from tests.e2e.hostcmd import sudo as _sudo
from tests.e2e.site_vars import CONVERGE_TIMEOUT

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

FLEET = f"{E2E_FLEET}-bare"
# What a stock server lacks and os_packages installs (their Debian 12 names, as the standard image bakes them in).
LEFT_OUT = ("python3-venv", "nginx-light", "libnginx-mod-http-js", "numactl")
# What the role installs on Debian 12 instead, per host group (roles/os_packages/vars/Debian-12.yml).
INSTALLED = {"vlm": ("python3.11-venv", "numactl"), "lb": ("nginx", "libnginx-mod-http-js")}
REGISTRY = ("deb.debian.org", 80)


def _bare_packages() -> tuple[str, ...]:
    from ops.staging.image import PACKAGES

    return tuple(p for p in PACKAGES if p not in LEFT_OUT)


@pytest.fixture(scope="module")
def bare_fleet():
    """c1 (vlm) and lb1 (lb), both containers of the image without LEFT_OUT."""
    yield from _fleet(FLEET, containers=1, vms=0, lb=True, packages=_bare_packages())


@pytest.fixture(scope="module")
def hosts(bare_fleet) -> dict[str, dict]:
    from ops.staging.inventory import hosts_of

    return hosts_of(Path(bare_fleet.inventory_path))


def _by_group(hosts: dict[str, dict], group: str) -> dict:
    return next(h for h in hosts.values() if group in h["groups"])


def _installed(host: dict, packages: tuple[str, ...]) -> dict[str, bool]:
    out = _ssh(host, "dpkg-query --show --showformat='${Package} ${db:Status-Status}\\n' " + " ".join(packages))
    states = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    return {p: states.get(p) == "installed" for p in packages}


def _assert_no_registry(host: dict) -> None:
    """The host cannot open a TCP connection to the registry the controller uses (bounded: 5 s)."""
    address = socket.getaddrinfo(*REGISTRY, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{REGISTRY[1]}' && echo REACHED || echo UNREACHABLE"
    out = _ssh(host, probe, timeout=30).stdout
    assert out.split() == ["UNREACHABLE"], f"{host['ansible_host']} reaches {REGISTRY[0]} ({address}): {out}"


def test_bare_hosts_lack_the_packages_and_reach_no_registry(hosts):
    for group, packages in INSTALLED.items():
        host = _by_group(hosts, group)
        assert not any(_installed(host, packages).values()), f"{group}: image has {packages}"
        _assert_no_registry(host)


def test_install_off_stops_and_names_the_missing_packages(bare_fleet, hosts):
    from ops.playbook import run_playbook

    for group, packages in INSTALLED.items():
        # One host at a time: a play whose every host failed ends the whole run, before the lb play.
        name = next(n for n, h in hosts.items() if group in h["groups"])
        run = run_playbook(bare_fleet.inventory_path, "site.yml", {"vlfleet_os_packages_install": False},
                           tags=["os_packages"], limit=name, timeout=600, echo=None)
        assert not run.ok, run.summary()
        messages = " ".join(f["msg"] for f in run.failed.get(name, []))
        assert "vlfleet_os_packages_install is false" in messages, (name, run.failed)
        for package in packages:
            assert package in messages, (name, package, messages)
        assert not any(_installed(hosts[name], packages).values()), f"{name}: installed something"


@pytest.fixture(scope="module")
def mirror(bare_fleet):
    """The mirror built on the controller against the bare image's dpkg status (only what the hosts lack)."""
    from ops.os_mirror.build import MirrorSpec, build
    from ops.staging.image import ImageSpec, image_path

    status = image_path(ImageSpec(packages=_bare_packages()).resolved()) / "var/lib/dpkg/status"
    return build(MirrorSpec(status=status))


def test_mirror_holds_only_what_the_image_lacks(mirror):
    from ops.os_mirror.needs import installed

    wanted = sorted(p for packages in INSTALLED.values() for p in packages)
    assert mirror.packages == wanted
    debs = dict(name.split("_")[:2] for name in mirror.debs)  # package -> version (file names carry no epoch)
    assert set(wanted) <= set(debs), sorted(debs)
    # Resolved against the image: nothing it has at that version comes again (a newer one may, as a dependency).
    status = Path(json.loads((mirror.path / "mirror.json").read_text())["status"]).read_text()
    image = _status_versions(status)
    assert {"apt", "python3-apt", "systemd"} <= installed(status) <= set(image)
    again = sorted(p for p, v in debs.items() if image.get(p, "").split(":")[-1] == v)
    assert not again, f"already in the image at the same version: {again}"


def _status_versions(text: str) -> dict[str, str]:
    versions, package = {}, ""
    for line in text.splitlines():
        if line.startswith("Package: "):
            package = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and package:
            versions[package] = line.split(": ", 1)[1]
    return versions


@pytest.fixture(scope="module")
def converged(bare_fleet, hosts, mirror, tiny_model: Path):
    """os_packages in check mode on the bare hosts, site.yml with installs on and the mirror served on the bridge,
    then os_packages again, and in check mode."""
    from ops.os_mirror.serve import running
    from ops.playbook import host_python_versions, run_playbook
    from ops.staging.converge_vars import site_vars
    from ops.staging.network import gateway

    inventory = bare_fleet.inventory_path
    with running(mirror.path, gateway(bare_fleet.subnet)) as served:
        extra = {**site_vars(tiny_model, min(host_python_versions(inventory).values())),
                 "vlfleet_os_packages_install": True, "vlfleet_os_packages_mirror": served.url}
        only = {"tags": ["os_packages"], "timeout": 600, "echo": None}  # site.yml's os_packages roles alone
        dry = run_playbook(inventory, "site.yml", extra, check=True, **only)
        dry_left = {name: _ssh(h, "ls /etc/apt/vlfleet-os-mirror 2>&1").stdout for name, h in hosts.items()}
        first = run_playbook(inventory, "site.yml", extra, timeout=CONVERGE_TIMEOUT, echo=print)
        again = run_playbook(inventory, "site.yml", extra, **only)
        check = run_playbook(inventory, "site.yml", extra, check=True, **only)
        fetched = list(served.requests)
    return {"dry": dry, "dry_left": dry_left, "first": first, "again": again, "check": check, "fetched": fetched}


def test_dry_run_on_bare_hosts_reports_the_install_and_writes_nothing(converged, hosts):
    dry = converged["dry"]
    assert dry.ok, dry.summary()
    for name in hosts:
        assert dry.recap[name]["changed"] > 0, (name, dry.changed)
        assert "No such file" in converged["dry_left"][name], (name, converged["dry_left"][name])


def test_site_converges_from_the_mirror(converged, hosts):
    first = converged["first"]
    assert first.ok, first.summary()
    for group, packages in INSTALLED.items():
        host = _by_group(hosts, group)
        assert all(_installed(host, packages).values()), (group, _installed(host, packages))
        # From the mirror: the controller served each package's .deb.
        for package in packages:
            assert any(Path(p).name.startswith(f"{package}_") for p in converged["fetched"]), (package, converged)
        _assert_no_registry(host)


def test_hosts_serve_after_the_mirror_install(converged, hosts):
    from ops.fleet.load import Load

    assert converged["first"].ok, converged["first"].summary()
    c1, lb1 = _by_group(hosts, "vlm"), _by_group(hosts, "lb")
    for address, port in ((c1["ansible_host"], 8000), (lb1["ansible_host"], 80)):
        answer = Load(address, port).one(0 if port == 8000 else 1, stream=True)
        assert answer["ok"], (address, port, answer)
    # numactl, installed by the role, is what the launcher execs the service under on multi-node hosts.
    assert _sudo(c1, "command -v numactl").strip()


def test_mirror_installs_are_idempotent_and_check_safe(converged):
    for name in ("again", "check"):
        run = converged[name]
        assert run.ok, (name, run.summary())
        changed = {h: n["changed"] for h, n in run.recap.items() if n["changed"]}
        assert not changed, (name, changed, run.changed)

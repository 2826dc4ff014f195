"""pyproject.toml's pins: every extra exact, one OpenVINO release for host and converter, and this venv as pinned."""

from __future__ import annotations

import re
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from ops import wheelhouse

EXTRAS: dict[str, list[str]] = wheelhouse.read_pyproject()["project"]["optional-dependencies"]
OPENVINO = ("openvino", "openvino-genai", "openvino-tokenizers")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(extra: str) -> dict[str, Requirement]:
    return {canonical(r.name): r for r in map(Requirement, EXTRAS[extra])}


def pinned_version(req: Requirement) -> str:
    (spec,) = req.specifier
    return spec.version


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_the_environments_have_their_extras():
    assert set(EXTRAS) == {"host", "converter", "controller", "test"}


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_requirement_is_one_exact_pin(extra):
    for line in EXTRAS[extra]:
        req = Requirement(line)
        specs = list(req.specifier)
        assert [s.operator for s in specs] == ["=="], f"{extra}: {line!r} is not an exact name==version pin"
        assert "*" not in specs[0].version, f"{extra}: {line!r} pins a wildcard"
        assert req.marker is None and not req.extras and req.url is None, f"{extra}: {line!r} is more than a pin"
    names = [canonical(Requirement(line).name) for line in EXTRAS[extra]]
    assert len(names) == len(set(names)), f"{extra} names a package twice: {names}"


def test_openvino_packages_share_one_release_in_host_and_converter():
    host, converter = pins("host"), pins("converter")
    assert set(OPENVINO) <= set(host), "the host extra must pin openvino, openvino-genai and openvino-tokenizers"
    assert {"openvino", "openvino-tokenizers"} <= set(converter)
    releases = {}
    for extra, reqs in (("host", host), ("converter", converter)):
        for name in OPENVINO:
            if name in reqs:
                # openvino is X.Y.Z, genai and tokenizers X.Y.Z.N: the release is the first three parts.
                releases[f"{extra}:{name}"] = Version(pinned_version(reqs[name])).release[:3]
    assert len(set(releases.values())) == 1, f"OpenVINO packages from more than one release: {releases}"
    for name in set(host) & set(converter):  # one package, one version, whichever environment installs it
        assert pinned_version(host[name]) == pinned_version(converter[name]), name


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_installed_versions_are_the_pins(extra):
    reqs = pins(extra)
    found = {name: installed(name) for name in reqs}
    missing = sorted(name for name, version in found.items() if version is None)
    if missing:  # not this environment's extra (bootstrap_venv.sh installs all four)
        pytest.skip(f"the {extra} extra is not installed here: {', '.join(missing)} missing")
    wrong = {name: f"installed {version}, pinned {pinned_version(reqs[name])}" for name, version in found.items()
             # ==X.Y.Z admits a local build label (torch 2.13.0+cpu), as pip does.
             if not reqs[name].specifier.contains(version, prereleases=True)}
    assert not wrong, f"{extra}: {wrong}"

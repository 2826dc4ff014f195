"""roles/os_packages: one vars file per supported distribution, each naming packages for the same needs, and the
needs the role accepts are the ones site.yml asks for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "os_packages"
SITE = Path(__file__).resolve().parents[2] / "ops" / "playbooks" / "site.yml"
# The distributions the roles support, and the Python each ships (its venv package carries the version).
DISTROS = {"Debian-12": "3.11", "Ubuntu-22.04": "3.10", "Ubuntu-24.04": "3.12"}


def _names(distro: str) -> dict[str, list[str]]:
    return yaml.safe_load((ROLE / "vars" / f"{distro}.yml").read_text())["os_packages_names"]


def _choices() -> set[str]:
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    return set(specs["argument_specs"]["main"]["options"]["os_packages_needed"]["choices"])


def test_one_vars_file_per_supported_distribution():
    assert sorted(p.stem for p in (ROLE / "vars").glob("*.yml")) == sorted(DISTROS)


@pytest.mark.parametrize("distro", sorted(DISTROS))
def test_every_distribution_names_the_same_needs(distro: str):
    names = _names(distro)
    assert set(names) == _choices()
    for need, packages in names.items():
        assert packages and all(isinstance(p, str) and p for p in packages), (distro, need)
        assert len(set(packages)) == len(packages), (distro, need)


@pytest.mark.parametrize(("distro", "python"), sorted(DISTROS.items()))
def test_the_venv_package_is_the_distributions_python(distro: str, python: str):
    # The versioned package holds ensurepip; python3-venv only depends on it.
    assert _names(distro)["python_venv"][0] == f"python{python}-venv"


def test_site_asks_only_for_known_needs():
    plays = yaml.safe_load(SITE.read_text())
    asked = [need for play in plays for role in play.get("roles", []) if isinstance(role, dict)
             and role.get("role") == "os_packages" for need in role.get("os_packages_needed", [])]
    assert set(asked) == _choices()

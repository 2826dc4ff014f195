"""ops.wheelhouse without the network: platform tags, pins from pyproject, the 3.10 TOML fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops import wheelhouse

REPO = Path(__file__).resolve().parents[2]


def test_platform_expands_to_every_older_manylinux() -> None:
    tags = wheelhouse.platform_tags("manylinux_2_35_x86_64")
    assert tags[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_28_x86_64" in tags  # openvino's wheels
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    legacy = wheelhouse.platform_tags("manylinux2014_x86_64")
    assert legacy[0] == "manylinux_2_17_x86_64" and "manylinux_2_28_x86_64" not in legacy


def test_bad_target_is_explained() -> None:
    with pytest.raises(wheelhouse.WheelhouseError, match="--python must be one of"):
        wheelhouse.Target("2.7", wheelhouse.DEFAULT_PLATFORM)
    with pytest.raises(wheelhouse.WheelhouseError, match="not a wheel platform tag"):
        wheelhouse.Target("3.10", "Ubuntu 22.04")


def test_host_pins_come_from_pyproject() -> None:
    pins = wheelhouse.host_pins()
    assert any(p.startswith("openvino-genai==") for p in pins)
    assert all("==" in p for p in pins)
    assert not any(p.startswith(("torch", "transformers")) for p in pins)  # hosts never need them


def test_py310_toml_reader_agrees_with_tomllib() -> None:
    import tomllib

    text = (REPO / "pyproject.toml").read_text()
    want = tomllib.loads(text)["project"]
    got = wheelhouse._read_pyproject_310(text)["project"]
    assert got["version"] == want["version"]
    assert got["optional-dependencies"] == want["optional-dependencies"]


def test_loose_pin_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nversion = "1"\n[project.optional-dependencies]\nhost = [\n  "flask>=3",\n]\n')
    with pytest.raises(wheelhouse.WheelhouseError, match="must be exact"):
        wheelhouse.host_pins(pyproject)

"""cpu_check's `manylinux_glibc` filter: the oldest glibc a wheelhouse installs on, from its wheels' platform tags."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ops.wheelhouse import DEFAULT_PLATFORM, platform_tags

PLUGIN = Path(__file__).resolve().parents[2] / "roles" / "cpu_check" / "filter_plugins" / "manylinux.py"
_spec = importlib.util.spec_from_file_location("vlfleet_manylinux_filter", PLUGIN)
manylinux = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manylinux)

# File names as pip downloads them for the host wheelhouse (build tags, compressed tag sets, pure wheels).
WHEELHOUSE = [
    "flask-3.1.3-py3-none-any.whl",
    "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
    "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "openvino-2026.4.1-22982-cp311-cp311-manylinux_2_28_x86_64.whl",
    "openvino_genai-2026.4.1.0-2636-cp311-cp311-manylinux_2_28_x86_64.whl",
    "openvino_tokenizers-2026.4.1.0-py3-none-manylinux_2_28_x86_64.whl",
    "pillow-12.3.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl",
    "vlfleet-0.1.0-py3-none-any.whl",
]


@pytest.mark.parametrize(("name", "glibc"), [
    ("flask-3.1.3-py3-none-any.whl", None),
    ("openvino-2026.4.1-22982-cp311-cp311-manylinux_2_28_x86_64.whl", (2, 28)),
    # a compressed tag set installs wherever one of its tags does: the lowest counts
    ("pillow-12.3.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", (2, 27)),
    ("numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", (2, 17)),
    ("old-1.0-cp27-cp27mu-manylinux1_x86_64.whl", (2, 5)),
    ("mid-1.0-cp36-cp36m-manylinux2010_x86_64.whl", (2, 12)),
    ("x-1.0-cp311-cp311-manylinux_2_9_x86_64.whl", (2, 9)),
    ("musl-1.0-cp311-cp311-musllinux_1_1_x86_64.whl", None),
    ("local-1.0-cp311-cp311-linux_x86_64.whl", None),
    ("/some/dir/openvino-2026.4.1-22982-cp311-cp311-manylinux_2_28_x86_64.whl", (2, 28)),
    ("requirements.txt", None),
    ("not-a-wheel.whl", None),
])
def test_wheel_glibc(name, glibc):
    assert manylinux.wheel_glibc(name) == glibc


def test_wheelhouse_needs_the_highest_wheel_minimum_and_names_those_wheels():
    assert manylinux.manylinux_glibc(WHEELHOUSE, "2.17") == {
        "version": "2.28",
        "wheels": ["openvino-2026.4.1-22982-cp311-cp311-manylinux_2_28_x86_64.whl",
                   "openvino_genai-2026.4.1.0-2636-cp311-cp311-manylinux_2_28_x86_64.whl",
                   "openvino_tokenizers-2026.4.1.0-py3-none-manylinux_2_28_x86_64.whl"]}


def test_versions_compare_as_numbers_not_strings():
    # 2.9 < 2.28: a string comparison would pick 2.9
    got = manylinux.manylinux_glibc(["a-1-cp3-cp3-manylinux_2_9_x86_64.whl", "b-1-cp3-cp3-manylinux_2_28_x86_64.whl"])
    assert got["version"] == "2.28"


def test_no_manylinux_wheel_gives_the_default():
    assert manylinux.manylinux_glibc([], "2.28") == {"version": "2.28", "wheels": []}
    assert manylinux.manylinux_glibc(["flask-3.1.3-py3-none-any.whl"], "2.28") == {"version": "2.28", "wheels": []}


def test_a_wheelhouse_for_the_default_platform_never_needs_more_than_its_glibc():
    # ops.wheelhouse asks pip for every tag a host of DEFAULT_PLATFORM accepts; each must parse to at most its glibc.
    limit = tuple(int(x) for x in DEFAULT_PLATFORM.split("_")[1:3])
    for tag in platform_tags(DEFAULT_PLATFORM):
        got = manylinux.wheel_glibc(f"pkg-1.0-cp310-cp310-{tag}.whl")
        assert got is not None and got <= limit, tag


def test_ansible_sees_the_filter():
    assert manylinux.FilterModule().filters()["manylinux_glibc"] is manylinux.manylinux_glibc

"""wheelhouse.build for the hosts' Pythons resolves completely offline.

3.11 (Debian 12 staging hosts): a real install into a fresh venv with --no-index, then the host runtime and the
service import, and the host-side manifest CLI runs. 3.10 (Ubuntu 22.04): no CPython 3.10 here, so pip's
resolver proves the set complete for that target (--dry-run --python-version 3.10 --only-binary=:all:).
One build per Python version per session (cached under the vlfleet cache across sessions).
Building downloads from the package index the first time; everything after that is offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops import wheelhouse

# This machine's pip config adds local wheel directories and indexes: ignore it, the wheelhouse must suffice.
OFFLINE_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def _build(python: str) -> Path:
    return wheelhouse.assemble(wheelhouse.Target(python, wheelhouse.DEFAULT_PLATFORM), quiet=True)


@pytest.fixture(scope="session")
def wheelhouse_310() -> Path:
    return _build("3.10")


@pytest.fixture(scope="session")
def wheelhouse_311() -> Path:
    return _build("3.11")


def pip_install_args(directory: Path) -> list[str]:
    return ["install", "--no-index", "--find-links", str(directory), "--require-hashes", "-r",
            str(directory / "requirements.txt")]


@pytest.mark.slow
def test_wheelhouse_index_describes_its_files(wheelhouse_310: Path) -> None:
    index = json.loads((wheelhouse_310 / "wheelhouse.json").read_text())
    assert index["python"] == "3.10" and index["platform"] == wheelhouse.DEFAULT_PLATFORM
    wheels = sorted(p.name for p in wheelhouse_310.glob("*.whl"))
    assert sorted(index["files"]) == wheels
    assert index["total_size"] == sum((wheelhouse_310 / w).stat().st_size for w in wheels)
    assert any(w.startswith("vlfleet-") for w in wheels)
    assert not any(w.startswith(("torch-", "transformers-")) for w in wheels)
    requirements = (wheelhouse_310 / "requirements.txt").read_text().splitlines()
    pins = [line for line in requirements if line and not line.startswith("#")]
    assert len(pins) == len(wheels) and all("==" in p and "--hash=sha256:" in p for p in pins)


@pytest.mark.slow
def test_wheelhouse_for_310_resolves_completely_offline(wheelhouse_310: Path, tmp_path: Path) -> None:
    platforms = [a for tag in wheelhouse.platform_tags(wheelhouse.DEFAULT_PLATFORM) for a in ("--platform", tag)]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", *pip_install_args(wheelhouse_310), "--dry-run", "--python-version", "3.10",
           "--implementation", "cp", "--only-binary=:all:", *platforms, "--target", str(tmp_path / "target"),
           "--report", str(report), "--quiet"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=OFFLINE_ENV, timeout=600)
    assert res.returncode == 0, res.stderr
    installed = {i["metadata"]["name"].lower().replace("_", "-") for i in json.loads(report.read_text())["install"]}
    assert {"vlfleet", "openvino", "openvino-genai", "openvino-tokenizers", "flask", "gunicorn"} <= installed
    cp310 = [i["download_info"]["url"] for i in json.loads(report.read_text())["install"]
             if "openvino-20" in i["download_info"]["url"]]
    assert cp310 and all("cp310" in u for u in cp310)


@pytest.mark.slow
def test_wheelhouse_for_311_installs_offline_into_a_fresh_venv(wheelhouse_311: Path, tmp_path: Path,
                                                               tiny_model: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    res = subprocess.run([str(py), "-m", "pip", *pip_install_args(wheelhouse_311), "--quiet"], capture_output=True,
                         text=True, env=OFFLINE_ENV, timeout=900)
    assert res.returncode == 0, res.stderr
    # Outside the checkout, so `service` comes from the installed wheel, not the working tree.
    check = subprocess.run([str(py), "-c", "import openvino_genai, service, service.runtime.manifest; "
                            "print(service.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert check.returncode == 0, check.stderr
    assert str(venv) in check.stdout
    verify = subprocess.run([str(py), "-m", "service.runtime.manifest", "verify", str(tiny_model), "--full"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["runtime"]["ok"] is True  # the wheelhouse's OpenVINO can load it


@pytest.mark.slow
def test_unavailable_platform_is_explained(wheelhouse_310: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # manylinux2014 (glibc 2.17) is too old for openvino's wheels: the error says what to use instead.
    # Offline: pip looks only in the 3.10 wheelhouse, which has openvino for manylinux_2_28 alone.
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse_310))
    with pytest.raises(wheelhouse.WheelhouseError, match="manylinux_2_28 or newer"):
        wheelhouse.download_deps(wheelhouse.Target("3.10", "manylinux2014_x86_64"), ["openvino==2026.4.1"],
                                 quiet=True)

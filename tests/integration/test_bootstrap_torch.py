"""ops/bootstrap_venv.sh installs torch's CPU build where pip's own indexes would give the CUDA one.

A fresh Ubuntu server's pip reaches PyPI only, whose x86_64 torch is the CUDA build (several GB of NVIDIA libraries).
Here two loopback indexes stand for PyPI (the pin as a plain release) and the PyTorch CPU index (the pin as +cpu);
pip runs with no configuration of this machine's (PIP_CONFIG_FILE=/dev/null), and the bootstrap's dry run names the
wheel it resolved and the index it came from.
"""

from __future__ import annotations

import functools
import http.server
import os
import platform
import re
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PIN = re.search(r'"torch==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="only x86_64's PyPI torch is a CUDA build")


def fake_wheel(directory: Path, version: str) -> None:
    """A wheel with torch's name and ``version`` and nothing inside: pip reads its metadata only (a dry run)."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(directory / f"torch-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


@pytest.fixture
def indexes(tmp_path):
    """http://127.0.0.1:PORT/ serving pypi/torch/ (the plain pin) and cpu/torch/ (the pin as +cpu) as directory
    listings, which pip reads as simple indexes."""
    fake_wheel(tmp_path / "pypi" / "torch", PIN)
    fake_wheel(tmp_path / "cpu" / "torch", f"{PIN}+cpu")
    (tmp_path / "empty" / "torch").mkdir(parents=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def dry_run(index: str, torch_index: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLFLEET_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index, PIP_RETRIES="0", PIP_TIMEOUT="10",
               VLFLEET_TORCH_INDEX=torch_index)
    return subprocess.run(["bash", str(REPO / "ops" / "bootstrap_venv.sh"), "--torch-dry-run", str(REPO / ".venv")],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_pypi_only_pip_gets_the_cpu_build_from_the_cpu_index(indexes):
    done = dry_run(f"{indexes}/pypi/", f"{indexes}/cpu/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"torch: torch-{PIN}+cpu-py3-none-any.whl (from {indexes}/cpu/)", done.stdout


def test_a_pip_that_already_resolves_the_cpu_build_is_left_as_it_is(indexes):
    closed = "http://127.0.0.1:9/never-asked/"  # the discard port: were it asked, pip would fail or warn
    done = dry_run(f"{indexes}/cpu/", closed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"torch: torch-{PIN}+cpu-py3-none-any.whl", done.stdout
    assert "never-asked" not in done.stderr


def test_an_index_without_the_cpu_build_is_named_with_the_fix(indexes):
    done = dry_run(f"{indexes}/pypi/", f"{indexes}/empty/")
    assert done.returncode == 1, done.stdout
    assert f"torch=={PIN} resolves to {indexes}/pypi/torch/torch-{PIN}-py3-none-any.whl, not a CPU build" in done.stderr
    assert f"set VLFLEET_TORCH_INDEX to an index (or mirror) that holds {PIN}+cpu" in done.stderr

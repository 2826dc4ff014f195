"""llama-server as a wheel from the cached test build: its files and RECORD, a hash-checked offline pip install into
a scratch directory, the installed binary running on its own copies of the libraries, and the real llamacpp service
finding it with no VLFLEET_LLAMACPP_SERVER, serving VLFLEET_LLAMACPP_MODEL_DIR beside an OpenVINO VLFLEET_MODEL_DIR.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from ops import wheelhouse
from ops.llamacpp import wheel as wheel_mod
from service.engine.llamacpp_child import child_env
from tests import servers
from tests.integration.conftest import image_message
from tests.prereq import require_tools

MODEL = "qwen3-vl-2b-instruct"
PACKAGE = "vlfleet_llama_server"
# This machine's pip config adds local wheel directories and indexes: ignore it, the wheel must suffice.
OFFLINE_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


@pytest.fixture(scope="module")
def test_build():
    """The cached test build, or a build now (once per machine and CPU, ~12 min)."""
    from ops.llamacpp import build

    config = build.test_config()
    if build.find(config) is None:
        require_tools("cmake", "c++", "make")
    require_tools("readelf", "ldd")
    return build.build(config)


@pytest.fixture(scope="module")
def wheel(test_build) -> Path:
    return wheel_mod.runtime_wheel(test_build)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed as hosts install their wheelhouse (offline, hash-checked), into a scratch directory."""
    house, target = tmp_path_factory.mktemp("wheelhouse"), tmp_path_factory.mktemp("site")
    os.link(wheel, house / wheel.name)
    wheelhouse.write_index(house, wheelhouse.Target("3.11", wheelhouse.DEFAULT_PLATFORM), "test")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                    "--find-links", str(house), "--require-hashes", "-r", str(house / "requirements.txt")],
                   check=True, capture_output=True, env=OFFLINE_ENV, timeout=300)
    return target


def test_the_wheel_holds_llama_server_and_its_build_libraries_with_a_true_record(wheel, test_build):
    key = test_build.root.name.split("-", 1)[1]
    assert wheel.name == f"{PACKAGE}-{test_build.info['version']}+{key}-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        bins = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/bin/")}
        assert {"llama-server", "libllama-server-impl.so", "libllama.so.0", "libmtmd.so.0", "libggml-base.so.0"} <= bins
        assert not bins & {"llama-quantize", "llama-mtmd-cli", "libllama-quantize-impl.so", "libc.so.6"}
        for name, path in wheel_mod.binaries(test_build).items():  # each soname holds the file it resolves to
            assert zf.read(f"{PACKAGE}/bin/{name}") == path.resolve().read_bytes()
        assert bins == set(wheel_mod.binaries(test_build))
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = {row.split(",")[0]: row.split(",")[1:] for row in zf.read(record).decode().splitlines()}
        assert set(rows) == set(names) and rows[record] == ["", ""]
        for name in set(names) - {record}:
            data = zf.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rows[name] == [f"sha256={digest}", str(len(data))]


def test_the_installed_server_runs_on_its_own_copies_of_the_libraries(installed, test_build):
    server = installed / PACKAGE / "bin" / "llama-server"
    assert os.access(server, os.X_OK)
    env = child_env(server, {"PATH": "/usr/bin:/bin"})  # what the engine gives its child, on a clean environment
    assert str(test_build.root) not in str(env)
    assert subprocess.run([str(server), "--version"], env=env, capture_output=True, timeout=60).returncode == 0
    # The binaries' RUNPATH still names the build dir, which exists here: the loader must not need it.
    loaded = subprocess.run(["ldd", str(server)], env=env, capture_output=True, text=True, timeout=60,
                            check=True).stdout
    assert str(test_build.root) not in loaded and f"{installed}/{PACKAGE}/bin/libllama.so.0" in loaded
    # Whatever a host may lack (OpenMP's libgomp: a Debian 12 container without gcc has none) comes from the wheel;
    # only the libraries every glibc host has come from the system.
    for line in (row.strip() for row in loaded.splitlines() if " => " in row):
        name, _, path = line.partition(" => ")
        assert name in wheel_mod.SYSTEM_LIBS or path.startswith(f"{installed}/{PACKAGE}/bin/"), line


def test_the_service_runs_the_installed_server_on_the_gguf_artifact(installed, tiny_gguf, tiny_model, test_build,
                                                                    tmp_path, monkeypatch):
    monkeypatch.delenv("VLFLEET_LLAMACPP_SERVER", raising=False)
    service = servers.start(tiny_model, tmp_path, VLFLEET_ENGINE="llamacpp", VLFLEET_LLAMACPP_MODEL_DIR=str(tiny_gguf),
                            VLFLEET_LLAMACPP_START_TIMEOUT="120", PYTHONPATH=str(installed))
    try:
        gguf_id = json.loads((tiny_gguf / "manifest.json").read_text())["artifact_id"]
        assert servers.get(service.url + "/readyz")[1]["artifact_id"] == gguf_id
        (child,) = [p for p in psutil.Process(service.proc.pid).children(recursive=True) if p.name() == "llama-server"]
        assert Path(child.exe()) == installed / PACKAGE / "bin" / "llama-server"
        assert not [m.path for m in child.memory_maps() if str(test_build.root) in m.path]
        client = OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(model=MODEL, messages=[image_message("What is it?")], max_tokens=4,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True})
        assert list(stream)[-1].usage.completion_tokens == 4
    finally:
        service.stop()


def test_the_hybrid_engine_runs_on_the_installed_interface_library(installed, tiny_gguf, tiny_model, test_build,
                                                                   tmp_path, monkeypatch):
    """VLFLEET_LLAMACPP_LIB unset: the hybrid engine's llama.cpp process loads the wheel's libvlfleet_llama.so and,
    through it, the wheel's own libllama, not the build's."""
    monkeypatch.delenv("VLFLEET_LLAMACPP_LIB", raising=False)
    service = servers.start(tiny_model, tmp_path, VLFLEET_ENGINE="hybrid", VLFLEET_LLAMACPP_MODEL_DIR=str(tiny_gguf),
                            VLFLEET_ANSWER_CACHE_MB="0", PYTHONPATH=str(installed))
    try:
        (worker,) = [p for p in psutil.Process(service.proc.pid).children(recursive=True)
                     if "service.engine.llama_worker" in " ".join(p.cmdline())]
        maps = {m.path for m in worker.memory_maps()}
        assert {f"{installed}/{PACKAGE}/bin/libvlfleet_llama.so", f"{installed}/{PACKAGE}/bin/libllama.so.0"} <= maps
        assert not [m for m in maps if str(test_build.root) in m]
        client = OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.chat.completions.create(model=MODEL, messages=[image_message("What is it?")], max_tokens=4,
                                                extra_body={"ignore_eos": True})
        assert answer.usage.completion_tokens == 4
    finally:
        service.stop()

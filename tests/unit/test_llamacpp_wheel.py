"""llama-server as a wheel, without a build: the wheel's layout from fake files, the CPU check and the library path
of the child, the GGUF artifact chosen by VLFLEET_LLAMACPP_MODEL_DIR, and the wheelhouse's key with an extra wheel."""

from __future__ import annotations

import base64
import hashlib
import sys
import types
import zipfile
from pathlib import Path

import pytest

from ops import wheelhouse
from ops.llamacpp import wheel
from ops.llamacpp.build import PORTABLE_FLAGS, Build, BuildConfig
from service.engine.llamacpp_child import ChildError, check_isa, child_env, server_binary
from service.runtime.settings import load

ISA = ["avx2", "avx512f"]
# What readelf would say: the server needs the impl library, which needs ggml; ggml needs libc (on every host) and
# OpenMP's libgomp (not on every host: bundled from the controller).
NEEDED = {"llama-server": ["libllama-server-impl.so", "libc.so.6"], "libllama-server-impl.so": ["libggml.so.0"],
          "libggml.so.0.1.0": ["libc.so.6", "libgomp.so.1"], "libggml-cpu-haswell.so": ["libgomp.so.1"]}


def fake_build(root: Path, native: bool = True) -> Build:
    bin_dir = root / "0.3.36-abc123def456" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("llama-server", "llama-quantize", "libllama-server-impl.so", "libggml.so.0.1.0",
                 "libggml-cpu-haswell.so"):
        (bin_dir / name).write_bytes(f"ELF {name}".encode())
    (bin_dir / "libggml.so.0").symlink_to("libggml.so.0.1.0")
    info = {"version": "0.3.36", "flags": ["-DGGML_NATIVE=ON"] if native else list(PORTABLE_FLAGS)}
    if native:
        info["cpu"] = {"model": "Test CPU", "isa": ISA}
    return Build(bin_dir.parent.parent, info)


@pytest.fixture
def fake_readelf(monkeypatch, tmp_path):
    monkeypatch.setattr(wheel, "needed", lambda path: NEEDED.get(Path(path).resolve().name, []))
    (tmp_path / "libgomp.so.1").write_bytes(b"ELF libgomp")
    monkeypatch.setattr(wheel, "system_library", lambda name: tmp_path / name)
    (tmp_path / "libvlfleet_llama.so").write_bytes(b"ELF shim")
    monkeypatch.setattr(wheel, "shim_of", lambda build: tmp_path / "libvlfleet_llama.so")


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu {flags}\n")
    return path


def test_the_wheel_holds_the_server_and_the_libraries_it_needs_under_their_sonames(tmp_path, monkeypatch,
                                                                                   fake_readelf):
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "cache"))
    build = fake_build(tmp_path)
    path = wheel.runtime_wheel(build)
    assert path.name == "vlfleet_llama_server-0.3.36+abc123def456-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(path) as zf:
        bins = {n.split("/bin/")[1]: zf.getinfo(n) for n in zf.namelist() if "/bin/" in n}
        # No llama-quantize, no libc; a native build's backend variants are not loaded, so not shipped.
        assert set(bins) == {"llama-server", "libvlfleet_llama.so", "libllama-server-impl.so", "libggml.so.0",
                             "libgomp.so.1"}
        assert zf.read("vlfleet_llama_server/bin/libgomp.so.1") == b"ELF libgomp"
        assert zf.read("vlfleet_llama_server/bin/libggml.so.0") == b"ELF libggml.so.0.1.0"
        assert all(i.external_attr >> 16 & 0o777 == 0o755 for i in bins.values())
        assert "Root-Is-Purelib: false" in zf.read("vlfleet_llama_server-0.3.36+abc123def456.dist-info/WHEEL").decode()


def test_record_lists_every_file_with_its_hash_and_size(tmp_path, monkeypatch, fake_readelf):
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "cache"))
    with zipfile.ZipFile(wheel.runtime_wheel(fake_build(tmp_path))) as zf:
        record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [line.split(",") for line in zf.read(record_name).decode().splitlines()]
        assert sorted(r[0] for r in rows) == sorted(zf.namelist())
        for name, digest, size in rows:
            if name == record_name:
                assert digest == size == ""
                continue
            data = zf.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_the_same_build_gives_the_same_wheel_bytes(tmp_path, monkeypatch, fake_readelf):
    build = fake_build(tmp_path)
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "one"))
    first = wheel.runtime_wheel(build).read_bytes()
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "two"))
    copied = wheel.runtime_wheel(build, tmp_path / "out")
    assert copied.parent == tmp_path / "out" and copied.read_bytes() == first


def test_a_portable_build_ships_its_cpu_backends_and_requires_no_isa(tmp_path, monkeypatch, fake_readelf):
    build = fake_build(tmp_path, native=False)
    assert "libggml-cpu-haswell.so" in wheel.binaries(build)
    assert wheel.build_json(build)["requires_isa"] == [] and not wheel.build_json(build)["native"]
    assert wheel.build_json(fake_build(tmp_path / "n"))["requires_isa"] == ISA


def test_a_native_build_for_an_amx_cpu_is_native_though_ggml_native_is_off(tmp_path):
    amx = {"cpu": "Intel Xeon", "isa": ["avx2", "avx512f", "amx_int8"], "flags": ["avx2", "amx_int8"]}
    flags = list(BuildConfig(cpu=amx).flags())
    assert "-DGGML_NATIVE=OFF" in flags  # ops.llamacpp.build.native_flags
    for info in ({"version": "0.3.36", "flags": flags, "cpu": {"model": "Intel Xeon", "isa": ISA}},
                 {"version": "0.3.36", "flags": flags, "cpu": {"model": "Intel Xeon", "isa": ISA}, "native": True}):
        root = tmp_path / str(len(info))
        (root / "build" / "bin").mkdir(parents=True)
        built = wheel.build_json(Build(root, info))
        assert built["native"] and built["requires_isa"] == ISA
    assert not wheel.is_native({"flags": list(PORTABLE_FLAGS)}) and not wheel.is_native({"native": False})


def test_a_native_package_on_a_cpu_without_its_flags_is_refused_with_the_fix(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text("")
    with pytest.raises(ChildError, match=r"lacks avx512f\..*--portable"):
        check_isa(server, server, ISA, cpuinfo(tmp_path, "avx2 sse4_2"))
    check_isa(server, server, ISA, cpuinfo(tmp_path, "avx2 avx512f"))
    check_isa(server, server, [], cpuinfo(tmp_path, ""))  # a portable build


def test_the_cpu_check_applies_only_to_the_packages_own_binary(tmp_path):
    other = tmp_path / "other-llama-server"
    other.write_text("")
    check_isa(other, tmp_path / "llama-server", ISA, cpuinfo(tmp_path, ""))


def test_the_installed_package_is_the_default_binary_and_is_checked(tmp_path, monkeypatch):
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text("")
    package = types.SimpleNamespace(server=lambda: server, BUILD={"requires_isa": []})
    monkeypatch.setitem(sys.modules, "vlfleet_llama_server", package)
    assert server_binary(None) == server
    package.BUILD = {"requires_isa": ["vlfleet_no_such_flag"]}
    with pytest.raises(ChildError, match="vlfleet_no_such_flag"):
        server_binary(None)
    configured = tmp_path / "mine"
    configured.write_text("")
    assert server_binary(configured) == configured  # VLFLEET_LLAMACPP_SERVER wins, unchecked


def test_the_child_finds_its_libraries_beside_the_binary(tmp_path):
    binary = tmp_path / "bin" / "llama-server"
    assert child_env(binary, {"PATH": "/bin"}) == {"PATH": "/bin", "LD_LIBRARY_PATH": str(tmp_path / "bin")}
    assert child_env(binary, {"LD_LIBRARY_PATH": "/opt/x"})["LD_LIBRARY_PATH"] == f"{tmp_path / 'bin'}:/opt/x"


def test_the_llamacpp_engine_serves_the_gguf_artifact_from_the_shared_env():
    env = {"VLFLEET_MODEL_DIR": "/m/openvino", "VLFLEET_LLAMACPP_MODEL_DIR": "/m/gguf"}
    assert load({**env, "VLFLEET_ENGINE": "llamacpp"}).model_dir == Path("/m/gguf")
    assert load({**env, "VLFLEET_ENGINE": "direct"}).model_dir == Path("/m/openvino")
    assert load({"VLFLEET_MODEL_DIR": "/m/gguf", "VLFLEET_ENGINE": "llamacpp"}).model_dir == Path("/m/gguf")
    assert load({"VLFLEET_LLAMACPP_MODEL_DIR": "/m/gguf", "VLFLEET_ENGINE": "llamacpp"}).model_dir == Path("/m/gguf")


def test_an_extra_wheel_is_part_of_the_wheelhouse_key(tmp_path):
    target = wheelhouse.Target("3.10", wheelhouse.DEFAULT_PLATFORM)
    extra = tmp_path / "vlfleet_llama_server-1+k-py3-none-linux_x86_64.whl"
    extra.write_bytes(b"one")
    without, with_extra = wheelhouse.cache_key(target, ["a==1"]), wheelhouse.cache_key(target, ["a==1"], [extra])
    extra.write_bytes(b"two")
    assert len({without, with_extra, wheelhouse.cache_key(target, ["a==1"], [extra])}) == 3


def test_system_library_is_found_where_the_loader_finds_it_and_a_missing_one_is_named():
    libc = wheel.system_library("libc.so.6")
    assert libc.name == "libc.so.6" and libc.exists()
    with pytest.raises(wheel.WheelError, match=r"libnothere\.so\.9"):
        wheel.system_library("libnothere.so.9")

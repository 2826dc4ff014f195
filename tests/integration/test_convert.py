"""model.convert / verify / build on the tiny synthetic checkpoint with the real optimum-cli export and the real
VLMPipeline: manifest, no-op and refusal on re-convert, a killed convert, tampering, the service's start gate."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from ops.model.convert import ConvertParams, convert
from service.runtime import manifest as mf
from tests.integration.loopback_server import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
TINY = ConvertParams("int4", group_size=16)


def vlfleet(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ops.cli import main; main()", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "artifact"
    shutil.copytree(tiny_model, copy)
    return copy


def test_tiny_artifact_carries_a_complete_manifest(tiny_model: Path, tiny_checkpoint: Path) -> None:
    manifest = mf.read_manifest(tiny_model)
    assert manifest["source"]["kind"] == "dir" and manifest["source"]["uri"] == str(tiny_checkpoint)
    assert manifest["source"]["revision"].startswith("sha256:")
    assert manifest["weight_format"] == {"weight_format": "int4", "group_size": 16, "ratio": 1.0, "sym": False}
    assert {"optimum-intel", "transformers", "openvino", "nncf"} <= set(manifest["tools"])
    assert manifest["min_runtime"]["openvino"] == ".".join(manifest["tools"]["openvino"].split(".")[:2])
    assert "openvino_language_model.bin" in manifest["files"]
    assert manifest["artifact_id"] == mf.artifact_id(mf.scan(tiny_model))
    assert mf.verify(tiny_model, full=True).ok


def test_converting_again_with_the_same_inputs_is_a_no_op(tiny_model: Path, tiny_checkpoint: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    before = (tiny_model / "manifest.json").read_text()
    convert(tiny_checkpoint, tiny_model, TINY)
    assert "nothing to do" in capsys.readouterr().err
    assert (tiny_model / "manifest.json").read_text() == before


def test_a_directory_that_is_no_artifact_is_not_overwritten(tmp_path: Path, tiny_checkpoint: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a vlfleet artifact"):
        convert(tiny_checkpoint, out, TINY, quiet=True)
    assert (out / "precious.txt").read_text() == "keep me"


def test_different_content_is_refused_and_the_artifact_kept(model_copy: Path, tiny_checkpoint: Path) -> None:
    before = mf.read_manifest(model_copy)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        convert(tiny_checkpoint, model_copy, ConvertParams("int8"), quiet=True)
    assert mf.read_manifest(model_copy) == before
    assert mf.verify(model_copy, full=True).ok
    assert not list(model_copy.parent.glob(".*partial"))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_killed_convert_leaves_no_artifact_and_no_orphan(tmp_path: Path, tiny_checkpoint: Path) -> None:
    out = tmp_path / "killed"
    code = ("import sys; from pathlib import Path; from ops.model.convert import ConvertParams, convert; "
            "convert(Path(sys.argv[1]), Path(sys.argv[2]), ConvertParams('int4', group_size=16), quiet=True)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny_checkpoint), str(out)], cwd=REPO)
    partial = tmp_path / ".killed.partial"
    exporter: list[int] = []
    try:
        deadline = time.monotonic() + 180
        # Kill mid-export: once the exporter has started writing its output.
        while time.monotonic() < deadline and proc.poll() is None:
            exporter = exporter or _children(proc.pid)
            if exporter and partial.exists() and any(partial.iterdir()):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "convert finished before it could be killed"
        assert exporter, "no optimum-cli child process seen"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert not out.exists()
    assert not (partial / "manifest.json").exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(exporter[0]):
        time.sleep(0.2)
    assert not _alive(exporter[0]), "optimum-cli outlived the killed convert"


def test_tampering_is_detected_and_named_by_model_verify(model_copy: Path) -> None:
    weights = model_copy / "openvino_language_model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    (model_copy / "openvino_tokenizer.xml").unlink()
    (model_copy / "rogue.py").write_text("print('hi')\n")
    res = vlfleet("model.verify", str(model_copy))
    assert res.returncode == 1  # the task's refusal; a crash would be non-zero as well
    report = json.loads(res.stdout[: res.stdout.rindex("}") + 1])
    assert report["modified"] == {"openvino_language_model.bin": "sha256 differs from the manifest"}
    assert report["missing"] == ["openvino_tokenizer.xml"]
    assert report["extra"] == ["rogue.py"]
    assert "does not match its manifest" in res.stderr


def test_service_start_gate_on_the_real_artifact(model_copy: Path) -> None:
    import openvino

    runtime = openvino.get_version()
    assert mf.check_startup(model_copy, runtime)["artifact_id"] == mf.read_manifest(model_copy)["artifact_id"]
    (model_copy / "openvino_vision_embeddings_model.bin").unlink()
    with pytest.raises(mf.ArtifactError, match=r"'files-present' failed .*openvino_vision_embeddings_model.bin"):
        mf.check_startup(model_copy, runtime)


def test_verify_smoke_generates_tokens_with_vlmpipeline(tiny_model: Path) -> None:
    res = vlfleet("model.verify", str(tiny_model), "--smoke")
    assert res.returncode == 0, res.stderr
    assert '"ok": true' in res.stdout
    assert "smoke: loaded in" in res.stdout and "4 tokens" in res.stdout


def test_build_from_a_tarball_url_converts_once(tiny_checkpoint: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from ops.model.build import build

    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path / "cache"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tiny_checkpoint, arcname="ckpt")
    with LoopbackServer() as server:
        server.files["/tiny.tar.gz"] = buf.getvalue()
        url = f"{server.url}/tiny.tar.gz"
        path, report = build(url, TINY, progress=False)
        assert report.ok and report.mode == "full"
        manifest = mf.read_manifest(path)
        assert manifest["source"]["kind"] == "url" and manifest["source"]["uri"] == url
        assert manifest["source"]["revision"].startswith("sha256:")
        again, report2 = build(url, TINY, progress=False)
    assert again == path and report2.ok
    assert mf.read_manifest(path)["created_at"] == manifest["created_at"]  # not converted a second time
    assert len([r for r in server.requests if r.method == "GET"]) == 1  # nor downloaded

"""service.runtime.manifest: content ids, verify (full and cheap), check_startup messages, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.runtime import manifest as mf

REPO = Path(__file__).resolve().parents[2]


def make_artifact(directory: Path, min_runtime: str = "2026.4") -> Path:
    directory.mkdir(parents=True)
    (directory / "openvino_language_model.xml").write_text("<net/>\n")
    (directory / "openvino_language_model.bin").write_bytes(bytes(range(256)) * 64)
    (directory / "sub").mkdir()
    (directory / "sub" / "tokenizer.json").write_text('{"a": 1}\n')
    manifest = mf.build_manifest(directory, source={"kind": "dir", "uri": "/x", "revision": "sha256:0"},
                                 weight_format={"weight_format": "int8"}, tools={"openvino": "2026.4.1"},
                                 min_runtime=min_runtime)
    mf.write_manifest(directory, manifest)
    return directory


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return make_artifact(tmp_path / "art")


def test_manifest_lists_every_file_with_size_and_sha256(artifact: Path) -> None:
    data = json.loads((artifact / "manifest.json").read_text())
    assert sorted(data["files"]) == ["openvino_language_model.bin", "openvino_language_model.xml",
                                     "sub/tokenizer.json"]
    assert data["files"]["openvino_language_model.bin"]["size"] == 256 * 64
    assert data["files"]["sub/tokenizer.json"]["sha256"] == mf.sha256_file(artifact / "sub" / "tokenizer.json")
    assert data["total_size"] == sum(f["size"] for f in data["files"].values())
    assert data["min_runtime"] == {"openvino": "2026.4"}


def test_artifact_id_depends_on_content_only(tmp_path: Path) -> None:
    a = make_artifact(tmp_path / "a")
    b = make_artifact(tmp_path / "b")  # same content, other place and time
    assert mf.read_manifest(a)["artifact_id"] == mf.read_manifest(b)["artifact_id"]
    (b / "sub" / "tokenizer.json").write_text('{"a": 2}\n')
    assert mf.artifact_id(mf.scan(b)) != mf.read_manifest(a)["artifact_id"]


def test_clean_artifact_verifies(artifact: Path) -> None:
    for full in (True, False):
        report = mf.verify(artifact, full=full, runtime_version="2026.4.1")
        assert report.ok, report.problems()
        assert report.runtime == {"required": "2026.4", "found": "2026.4.1", "ok": True}


def test_flipped_byte_is_named_in_full_mode_only(artifact: Path) -> None:
    path = artifact / "openvino_language_model.bin"
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    full = mf.verify(artifact, full=True, runtime_version="2026.4.1")
    assert not full.ok
    assert full.modified == {"openvino_language_model.bin": "sha256 differs from the manifest"}
    assert not full.missing and not full.extra
    # Same size: the cheap check cannot see it (that is what --full is for).
    assert mf.verify(artifact, full=False, runtime_version="2026.4.1").ok


def test_deleted_and_extra_files_are_named(artifact: Path) -> None:
    (artifact / "sub" / "tokenizer.json").unlink()
    (artifact / "stray.bin").write_bytes(b"x")
    for full in (True, False):
        report = mf.verify(artifact, full=full, runtime_version="2026.4.1")
        assert report.missing == ["sub/tokenizer.json"]
        assert report.extra == ["stray.bin"]
        assert "missing: sub/tokenizer.json" in report.problems()
        assert "extra: stray.bin" in report.problems()


def test_truncated_file_is_a_size_mismatch(artifact: Path) -> None:
    path = artifact / "openvino_language_model.bin"
    path.write_bytes(path.read_bytes()[:100])
    report = mf.verify(artifact, full=False, runtime_version="2026.4.1")
    assert report.modified == {"openvino_language_model.bin": "size 100 bytes, manifest says 16384"}


def test_edited_manifest_is_caught_by_its_id(artifact: Path) -> None:
    # Someone changes a file and "fixes" its manifest entry: the content id no longer matches.
    (artifact / "sub" / "tokenizer.json").write_text('{"a": 3}\n')
    data = json.loads((artifact / "manifest.json").read_text())
    data["files"]["sub/tokenizer.json"]["sha256"] = mf.sha256_file(artifact / "sub" / "tokenizer.json")
    (artifact / "manifest.json").write_text(json.dumps(data))
    report = mf.verify(artifact, full=True, runtime_version="2026.4.1")
    assert not report.ok and report.id_mismatch and "manifest was edited" in report.id_mismatch


def test_check_startup_passes_and_returns_manifest(artifact: Path) -> None:
    assert mf.check_startup(artifact, "2026.4.1")["artifact_id"] == mf.read_manifest(artifact)["artifact_id"]


@pytest.mark.parametrize("damage, check, words", [
    ("no-manifest", "manifest", ["manifest.json is missing", "vlfleet model.convert"]),
    ("bad-json", "manifest", ["not readable JSON", "vlfleet model.build"]),
    ("old-format", "manifest", ["format_version 0", "reads version 1"]),
    ("no-dir", "manifest", ["does not exist", "VLFLEET_MODEL_DIR"]),
    ("missing-file", "files-present", ["missing: sub/tokenizer.json", "model_artifact role"]),
    ("short-file", "file-sizes", ["openvino_language_model.bin: size 10 bytes, manifest says 16384"]),
    ("old-runtime", "runtime-version", ["needs OpenVINO runtime >= 2026.4, this host runs 2025.4.1",
                                        "vlfleet wheelhouse.build"]),
])
def test_check_startup_names_the_failed_check_and_the_fix(artifact: Path, damage: str, check: str,
                                                          words: list[str]) -> None:
    runtime = "2026.4.1"
    target = artifact
    if damage == "no-manifest":
        (artifact / "manifest.json").unlink()
    elif damage == "bad-json":
        (artifact / "manifest.json").write_text("{not json")
    elif damage == "old-format":
        data = json.loads((artifact / "manifest.json").read_text())
        (artifact / "manifest.json").write_text(json.dumps({**data, "format_version": 0}))
    elif damage == "no-dir":
        target = artifact.with_name("nowhere")
    elif damage == "missing-file":
        (artifact / "sub" / "tokenizer.json").unlink()
    elif damage == "short-file":
        (artifact / "openvino_language_model.bin").write_bytes(b"0123456789")
    elif damage == "old-runtime":
        runtime = "2025.4.1"
    with pytest.raises(mf.ArtifactError) as err:
        mf.check_startup(target, runtime)
    assert err.value.check == check
    message = str(err.value)
    assert message.startswith(f"model artifact check '{check}' failed for {target}")
    assert "Fix: " in message
    for word in words:
        assert word.replace("missing: ", "") in message


def test_extra_file_does_not_block_startup(artifact: Path) -> None:
    # The service's gate is the cheap list from the issue; extras are the checklist's (verify) business.
    (artifact / "notes.txt").write_text("x")
    mf.check_startup(artifact, "2026.4.1")


@pytest.mark.parametrize("found, required, ok", [
    ("2026.4.1-22982-e213a147257-releases/2026/4", "2026.4", True),
    ("2026.4.0", "2026.4", True),
    ("2026.3.9", "2026.4", False),
    ("2027.0", "2026.4.1", True),
    ("2026.4", "2026.4.1", False),
])
def test_version_comparison(found: str, required: str, ok: bool) -> None:
    assert mf.version_at_least(found, required) is ok


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.runtime.manifest", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60)


def test_cli_prints_json_and_exit_code(artifact: Path) -> None:
    ok = run_cli("verify", str(artifact), "--full", "--runtime-version", "2026.4.1")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    (artifact / "openvino_language_model.xml").unlink()
    bad = run_cli("verify", str(artifact), "--runtime-version", "2026.4.1")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["missing"] == ["openvino_language_model.xml"]
    assert report["problems"] == ["missing: openvino_language_model.xml"]


def test_cli_reports_a_directory_without_manifest(tmp_path: Path) -> None:
    res = run_cli("verify", str(tmp_path))
    assert res.returncode == 1
    assert "manifest.json is missing" in json.loads(res.stdout)["manifest_error"]


def test_manifest_module_is_stdlib_only_and_py310_safe() -> None:
    # Hosts run it from the wheelhouse venv on Python 3.10 before anything else is trusted.
    source = (REPO / "service" / "runtime" / "manifest.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
    assert imports <= set(sys.stdlib_module_names), imports - set(sys.stdlib_module_names)
    for forbidden in ("tomllib", "except*", "ExceptionGroup", "typing.Self"):
        assert forbidden not in source


def test_copy_keeps_identity(tmp_path: Path, artifact: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    assert mf.verify(copy, full=True, runtime_version="2026.4.1").ok


def test_one_rule_says_what_a_gguf_artifact_is(tmp_path):
    from ops.llamacpp.gguf import GgufParams

    gguf = {"weight_format": GgufParams("Q4_0", "q8_0").describe()}
    assert mf.gguf_parts(gguf) == {"language_model": "language-model-Q4_0.gguf", "mmproj": "mmproj-q8_0.gguf"}
    no_mmproj = {"weight_format": {"format": "gguf", "files": {"language_model": "lm.gguf"}}}
    for other in ({"weight_format": {"weight_format": "int4"}}, no_mmproj, {"weight_format": "gguf"}, [], {}):
        assert mf.gguf_parts(other) is None, other
    (tmp_path / mf.MANIFEST_NAME).write_text(json.dumps(gguf))
    assert mf.is_gguf_artifact(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_text("{not json")
    assert not mf.is_gguf_artifact(tmp_path) and not mf.is_gguf_artifact(tmp_path / "absent")

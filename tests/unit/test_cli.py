"""The `vlfleet` console script behaves like `fab` with the project's tasks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VLFLEET = str(Path(sys.executable).with_name("vlfleet"))


def test_list_shows_the_task_collection():
    out = subprocess.run([VLFLEET, "--list"], capture_output=True, text=True, check=True).stdout
    for name in ("model.synth", "model.convert", "serve"):
        assert name in out


def test_bad_shape_is_a_clear_error(tmp_path):
    result = subprocess.run([VLFLEET, "model.synth", "--shape", "7b", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True)
    assert result.returncode == 1  # invoke's Exit: a refusal, not a crash (which would also be non-zero)
    assert "--shape must be one of: tiny, 2b" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_ratio_takes_a_value_and_is_checked(tmp_path):
    # A float default once made invoke parse --ratio as a flag: `--ratio 0.8` then failed on a stray "0.8".
    result = subprocess.run([VLFLEET, "model.convert", "--source", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                             "--ratio", "1.5"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "ratio must be in (0, 1], got 1.5" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_site_gguf_refuses_what_it_cannot_ship_before_building_anything(tmp_path):
    inventory, artifact = tmp_path / "inventory.yml", tmp_path / "artifact"
    inventory.write_text("all: {}\n")
    artifact.mkdir()
    (artifact / "manifest.json").write_text("{}")
    site = [VLFLEET, "site", "--inventory", str(inventory), "--artifact", str(artifact)]
    for extra, message in ((["--gguf", "tiny", "--wheelhouse", str(tmp_path)], "leave out --wheelhouse"),
                           (["--gguf", "tiny", "--llamacpp-build", "fast"], "llama.cpp build 'fast': use portable"),
                           (["--gguf", str(artifact)], "not a GGUF artifact")):
        result = subprocess.run(site + extra, capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and message in result.stderr + result.stdout, result.stderr
        assert "Traceback" not in result.stderr
    result = subprocess.run([VLFLEET, "wheelhouse.build", "--llamacpp", "fast"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "llama.cpp build 'fast': use portable" in result.stderr, result.stderr


def test_report_refuses_a_bad_probe_image_before_reaching_any_host(tmp_path):
    result = subprocess.run([VLFLEET, "report", "--inventory", str(tmp_path / "missing.yml"), "--probe-image", "64"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "--probe-image: an image size is WIDTHxHEIGHT, each 1..4096 (e.g. 416x277), not '64'" in result.stderr
    assert "Traceback" not in result.stderr


def test_gguf_refuses_an_output_type_the_converter_cannot_set(tmp_path):
    result = subprocess.run([VLFLEET, "model.gguf", "--source", str(tmp_path), "--out", str(tmp_path / "o"),
                             "--quant", "F16", "--output-type", "Q4_K"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "set by llama-quantize, which F16 does not go through" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()

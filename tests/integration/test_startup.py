"""The service refuses to start on bad configuration or a bad artifact, with a message that names the fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SERVE = [str(Path(sys.executable).with_name("vlfleet-serve"))]


def run_service(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(SERVE, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("VLFLEET_PORT", "99999", "VLFLEET_PORT='99999' is not valid: expected an integer 1-65535"),
    ("VLFLEET_QUEUE_SIZE", "lots", "VLFLEET_QUEUE_SIZE='lots' is not valid"),
    ("VLFLEET_WARMUP", "maybe", "expected true or false"),
    ("VLFLEET_LOG_LEVEL", "loud", "expected debug, info, warning or error"),
])
def test_bad_setting_stops_with_the_variable_named(tiny_model, variable, value, expected):
    result = run_service({"VLFLEET_MODEL_DIR": str(tiny_model), variable: value})
    assert result.returncode == 2
    assert expected in result.stderr


def test_missing_model_dir_is_named():
    result = run_service({})
    assert result.returncode == 2
    assert "VLFLEET_MODEL_DIR is not set" in result.stderr


@pytest.fixture
def damaged_copy(tiny_model, tmp_path):
    copy = tmp_path / "artifact"
    shutil.copytree(tiny_model, copy)
    return copy


def test_artifact_with_missing_file_is_refused(damaged_copy):
    (damaged_copy / "openvino_language_model.bin").unlink()
    result = run_service({"VLFLEET_MODEL_DIR": str(damaged_copy)})
    assert result.returncode == 3
    assert "files-present" in result.stderr and "openvino_language_model.bin" in result.stderr
    assert "Fix:" in result.stderr


def test_artifact_without_manifest_is_refused(damaged_copy):
    (damaged_copy / "manifest.json").unlink()
    result = run_service({"VLFLEET_MODEL_DIR": str(damaged_copy)})
    assert result.returncode == 3
    assert "manifest" in result.stderr


def test_artifact_with_flipped_byte_is_refused(damaged_copy):
    target = damaged_copy / "openvino_language_model.bin"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
    target.write_bytes(bytes(data))
    result = run_service({"VLFLEET_MODEL_DIR": str(damaged_copy)})
    assert result.returncode == 3
    assert "file-hashes" in result.stderr and "openvino_language_model.bin" in result.stderr

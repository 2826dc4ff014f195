"""An int4 group size that does not divide the language model's widths is refused before the export, naming the ones
that work (it used to end minutes later in an nncf traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.model.convert import ConvertParams, GroupSizeError, check_group_size

VLFLEET = Path(sys.executable).parent / "vlfleet"


def _checkpoint(tmp_path: Path, hidden: int, intermediate: int, heads: int, head_dim: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", "text_config": {
        "hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads, "head_dim": head_dim}}))
    return tmp_path


def test_tiny_widths_refuse_128_and_name_what_works(tmp_path):
    src = _checkpoint(tmp_path, 64, 128, 4, 32)  # the tiny synthetic shape
    with pytest.raises(GroupSizeError, match=r"group size 128 does not divide .* \[64\].* --group-size 16 or 32 or 64"):
        check_group_size(src, ConvertParams("int4", group_size=128))
    check_group_size(src, ConvertParams("int4", group_size=64))
    check_group_size(src, ConvertParams("int4", group_size=-1))
    check_group_size(src, ConvertParams("int8"))


def test_real_2b_widths_take_128(tmp_path):
    check_group_size(_checkpoint(tmp_path, 2048, 6144, 16, 128), ConvertParams("int4", group_size=128))


def test_cli_says_it_in_one_line_without_a_traceback(tmp_path):
    (tmp_path / "ckpt").mkdir()
    src = _checkpoint(tmp_path / "ckpt", 64, 128, 4, 32)
    done = subprocess.run([str(VLFLEET), "model.convert", "--source", str(src), "--out", str(tmp_path / "art")],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "model.convert: int4 group size 128 does not divide the language model's layer widths [64] (all widths: "
        "[64, 128]); use --group-size 16 or 32 or 64 (-1 = per channel also works)"], done.stderr
    assert not (tmp_path / "art").exists()

"""Releasing mapped weight pages: only read-only mappings under the model directory, and data stays readable."""

from __future__ import annotations

import mmap

from service.runtime.mapped_weights import read_only_mappings, release


def test_release_drops_pages_and_data_still_reads(tmp_path):
    weights = tmp_path / "model" / "weights.bin"
    weights.parent.mkdir()
    payload = bytes(range(256)) * 4096 * 4  # 4 MiB
    weights.write_bytes(payload)
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 4096)
    with open(weights, "rb") as f, open(other, "rb") as g:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        unrelated = mmap.mmap(g.fileno(), 0, access=mmap.ACCESS_READ)
        assert mapped[:] == payload  # touch every page
        found = read_only_mappings(tmp_path / "model")
        assert [p for _, _, p in found] == [str(weights.resolve())]
        assert release(tmp_path / "model") >= len(payload)
        assert mapped[:] == payload  # faulted back in from the file
        assert unrelated[:1] == b"x"
        mapped.close()
        unrelated.close()


def test_writable_mappings_are_left_alone(tmp_path):
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "scratch.bin"
    path.write_bytes(b"\0" * 8192)
    with open(path, "r+b") as f:
        writable = mmap.mmap(f.fileno(), 0)
        writable[:5] = b"hello"
        assert read_only_mappings(tmp_path / "model") == []
        writable.close()

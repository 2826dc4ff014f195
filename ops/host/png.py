"""Solid-colour PNG images, for the smoke answer and the probes' questions (the host program has no Pillow)."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def solid(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A ``width`` x ``height`` 8-bit RGB PNG of one colour."""
    row = b"\0" + bytes(rgb) * width  # filter type 0 (none), then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(row * height, 9))
            + _chunk(b"IEND", b""))

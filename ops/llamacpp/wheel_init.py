"""llama.cpp's llama-server as vlfleet built it, with the shared libraries it needs."""

import json
from pathlib import Path

BIN = Path(__file__).parent / "bin"
BUILD = json.loads((Path(__file__).parent / "build.json").read_text())


def server() -> Path:
    return BIN / "llama-server"

"""Putting a finished artifact in place: the one step shared by every converter (IR, GGUF).

A converter writes into a hidden ``.partial`` sibling, then calls ``publish``: the directory is renamed into place
only when nothing is there yet; the same content already there is kept; different content is never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service import manifest as mf


def publish(tmp: Path, out: Path, manifest: Mapping[str, Any], say: Callable[[str], None]) -> bool:
    """Rename ``tmp`` to ``out``; False when ``out`` already holds this artifact (kept, ``tmp`` left to the caller).

    Raises FileExistsError when ``out`` holds a different artifact.
    """
    if out.exists():
        existing_id = mf.read_manifest(out)["artifact_id"]
        if existing_id != manifest["artifact_id"]:
            raise FileExistsError(
                f"{out} already holds artifact {existing_id}, and this conversion produced different "
                f"content ({manifest['artifact_id']}); refusing to overwrite it. Remove {out} or choose "
                "another --out")
        say(f"{out} already holds the same content (artifact {existing_id}); kept it")
        return False
    tmp.rename(out)
    return True

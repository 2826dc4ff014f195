"""An artifact's place on disk, the steps shared by every converter (IR, GGUF).

Before converting, ``up_to_date`` says whether the destination already holds this conversion (then there is nothing
to do). A converter writes into a hidden ``.partial`` sibling, then calls ``publish``: the directory is renamed into
place only when nothing is there yet; the same content already there is kept; different content is never
overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.runtime import manifest as mf


def up_to_date(out: Path, same_inputs: Callable[[Mapping[str, Any]], bool], say: Callable[[str], None]) -> bool:
    """True when ``out`` holds an intact artifact whose manifest ``same_inputs`` accepts: nothing to convert.

    Raises FileExistsError when ``out`` exists but is not an artifact (never overwritten).
    """
    if not out.exists():
        return False
    try:
        existing = mf.read_manifest(out)
    except mf.ArtifactError as e:
        raise FileExistsError(f"{out} exists and is not a vlfleet artifact ({e.problem}); "
                              "remove it or choose another --out") from e
    if same_inputs(existing) and mf.verify(out, full=False).ok:
        say(f"{out} already holds this conversion (artifact {existing['artifact_id']}); nothing to do")
        return True
    return False


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

"""`model.build`: fetch + convert + verify in one step, cached by (source, resolved revision, format, params).

The cache key also holds the converter's tool versions: a new optimum-intel or OpenVINO makes other bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ops.model.convert import ConvertParams, convert, tool_versions
from ops.model.fetch import Fetched, fetch
from ops.paths import cache_root
from service.runtime import manifest as mf


def build_key(fetched: Fetched, params: ConvertParams) -> str:
    blob = json.dumps({"source": fetched.origin, "params": params.describe(), "tools": tool_versions()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def artifact_dir(fetched: Fetched, params: ConvertParams) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(fetched.origin.get("uri", "model")).name or "model").strip("-")
    return cache_root() / "artifacts" / f"build-{name[:40]}-{params.label()}-{build_key(fetched, params)}"


def build(spec: str, params: ConvertParams, *, revision: str | None = None, out: Path | None = None,
          endpoint: str | None = None, token_file: str | None = None, sha256: str | None = None,
          progress: bool = True) -> tuple[Path, mf.VerifyReport]:
    """Fetch ``spec``, convert it with ``params`` (skipped when the cache has it) and verify every hash."""
    fetched = fetch(spec, revision, endpoint=endpoint, token_file=token_file, sha256=sha256, progress=progress)
    out = Path(out) if out else artifact_dir(fetched, params)
    convert(fetched.path, out, params, quiet=not progress, origin=fetched.origin)
    return out, mf.verify(out, full=True)

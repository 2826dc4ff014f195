"""A release to roll out (id, wheelhouse, artifact, env changes), and staging it on a host beside the running one:
the host program's stage step sets up its venv and writes the release's changes over the running release's env file."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.fleet.inventory import FleetError
from ops.fleet.transport import Fleet
from service.runtime.contract import HOST_NAMES, RELEASE_ID, RELEASE_ID_RULE
from service.runtime.settings import unknown_names


@dataclass
class Release:
    """What to roll out: a release id, and what differs from the release each host runs now."""

    id: str
    wheelhouse: Path | None = None  # new code/pins: a wheelhouse dir (None: reuse the current release's venv)
    artifact: Path | None = None  # new model: an artifact dir with manifest.json (None: keep the current model)
    env: dict[str, str] = field(default_factory=dict)  # VLFLEET_* changes; an empty value removes the variable

    def __post_init__(self) -> None:
        if not re.match(RELEASE_ID, self.id or ""):
            raise FleetError(f"--release: release id {self.id!r}: {RELEASE_ID_RULE}")
        if self.wheelhouse is not None and not (self.wheelhouse / "requirements.txt").is_file():
            raise FleetError(f"--wheelhouse {self.wheelhouse}: no requirements.txt there; build one with "
                             f"`vlfleet wheelhouse.build --python X.Y --out DIR`")
        if self.artifact is not None and not (self.artifact / "manifest.json").is_file():
            raise FleetError(f"--artifact {self.artifact}: no manifest.json there; build one with "
                             f"`vlfleet model.build`")
        bad = [k for k in self.env if not k.startswith("VLFLEET_")]
        if bad:
            raise FleetError(f"--env: only VLFLEET_* settings belong in a release's env file, not {', '.join(bad)}")
        unknown = unknown_names(self.env, HOST_NAMES)  # the host program's env step would refuse them on every host
        if unknown:
            raise FleetError(f"--env: {'; '.join(unknown)} (docs/configuration.md lists every setting)")

    @property
    def wheelhouse_sha(self) -> str | None:
        return (hashlib.sha256((self.wheelhouse / "requirements.txt").read_bytes()).hexdigest()
                if self.wheelhouse else None)

    @property
    def artifact_id(self) -> str | None:
        return json.loads((self.artifact / "manifest.json").read_text())["artifact_id"] if self.artifact else None


def parse_env_option(pairs: str | None) -> dict[str, str]:
    """"K=V,K2=V2" -> dict (a value may not contain commas; repeat --env for such values)."""
    env: dict[str, str] = {}
    for pair in (p for p in (pairs or "").split(",") if p.strip()):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FleetError(f"--env: {pair!r} is not KEY=VALUE")
        env[key.strip()] = value.strip()
    return env


def release_changes(release: Release, root: str) -> dict[str, str]:
    """What the release changes in the env file of the release a host runs (an empty value removes a setting)."""
    changes = {"VLFLEET_RELEASE_ID": release.id}
    if release.artifact_id:
        changes["VLFLEET_MODEL_DIR"] = f"{root}/models/{release.artifact_id}"
    changes.update(release.env)
    return changes


def _upload(fleet: Fleet, name: str, local: Path, tag: str, place: dict[str, str],
            timeout: float | None = None) -> None:
    """Copy a directory tree over SFTP to a fresh directory of the SSH user; the place step moves it as root."""
    conn = fleet.conns[name]
    upload = f"/tmp/vlfleet-upload-{tag}"
    conn.run(f"rm -rf {shlex.quote(upload)} && mkdir -p {shlex.quote(upload)}", hide=True, in_stream=False)
    sftp = conn.sftp()
    for path in sorted(local.rglob("*")):
        target = f"{upload}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            sftp.mkdir(target)
        elif path.is_file():
            sftp.put(str(path), target)
    fleet.step(name, "place", {"src": upload, **place}, timeout=timeout)


def stage_release(fleet: Fleet, name: str, release: Release, info: Mapping[str, Any]) -> str:
    """Put ``release`` on the host beside the running one; returns what was done."""
    h = fleet.host(name)
    args: dict[str, Any] = {"root": h.root, "release": release.id, "python": h.python,
                            "group": h.var("vlm_service_group", "vlfleet"), "env_from": info["current"],
                            "changes": release_changes(release, h.root)}
    sha = release.wheelhouse_sha
    if sha is None:
        args["venv_from"] = info["current"]
    else:
        # python_runtime names a release after its wheelhouse by default (sha256 of requirements.txt, 12 digits)
        same = [r["id"] for r in info["releases"] if r["complete"] and (r["wheelhouse_sha"] == sha or
                                                                        r["id"] == sha[:12])]
        if same:
            args["venv_from"] = same[-1]
        else:
            args["wheelhouse"] = f"{h.root}/wheelhouses/{release.id}"
            _upload(fleet, name, release.wheelhouse, sha[:12], {"dest": args["wheelhouse"]})  # type: ignore[arg-type]
    done = fleet.step(name, "stage", args, timeout=1900)
    what = f"venv {done['venv']}"
    if release.artifact_id and release.artifact_id not in info["models"]:
        _upload(fleet, name, release.artifact, release.artifact_id[:40],  # type: ignore[arg-type]
                {"dest": f"{h.root}/models/{release.artifact_id}",
                 "verify_with": f"{h.root}/releases/{release.id}/venv/bin/python"}, timeout=1900)
        what += f", model {release.artifact_id} copied and verified"
    return what

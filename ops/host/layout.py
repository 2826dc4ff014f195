"""The release tree on a host: `<root>/releases/<id>/{venv,vlfleet.env}`, `<root>/current` and `<root>/previous`
(symlinks to releases/<id>), `<root>/models/<id>`, `<root>/wheelhouses/<id>`; the files outside it that tune and the
launcher keep (contract.py, generated from service/runtime/contract.py); the service's address in an env file."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .contract import RELEASE_ID, RELEASE_ID_RULE
from .errors import HostError
from .system import sha256_file

COMPLETE = ".vlfleet-complete"  # python_runtime's marker of a finished venv
WHEELHOUSE_MARK = ".vlfleet-wheelhouse"  # sha256 of the requirements.txt the venv was built from


def check_id(release: str) -> str:
    if not re.match(RELEASE_ID, release or ""):
        raise HostError(f"release id {release!r}: {RELEASE_ID_RULE}")
    return release


def link_target(link: Path) -> str | None:
    """The release id a `current`/`previous` symlink points at, or None."""
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def parse_env(text: str) -> dict[str, str]:
    """An env file's NAME=value lines (the last of a name wins, as in systemd's EnvironmentFile=)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def read_env(path: Path) -> dict[str, str]:
    """``parse_env`` of the file at ``path``; {} when it cannot be read."""
    try:
        return parse_env(path.read_text())
    except OSError:
        return {}


def wheelhouse_sha(root: Path, release: str) -> str | None:
    """sha256 of the requirements.txt a release's venv was built from (our marker, else the role's wheelhouse)."""
    mark = root / "releases" / release / "venv" / WHEELHOUSE_MARK
    if mark.is_file():
        return mark.read_text().strip() or None
    return sha256_file(root / "wheelhouses" / release / "requirements.txt")


def release_dir(args: dict) -> tuple[Path, str, Path]:
    root = Path(args["root"])
    release = check_id(args["release"])
    return root, release, root / "releases" / release


def service_address(env: dict[str, str]) -> tuple[str, int]:
    host = env.get("VLFLEET_HOST", "127.0.0.1")
    if host in ("", "0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    return host, int(env.get("VLFLEET_PORT", "8000"))

"""The env file, `releases/<id>/vlfleet.env` (root:<group> 0640): this is its only writer."""

from __future__ import annotations

import difflib
import re

from .contract import SETTING_NAMES
from .errors import HostError, flag
from .layout import check_id, link_target, read_env, release_dir
from .system import group_id, write_atomic

ENV_HEADER = ("# Managed by vlfleet (the env step of the host program, ops/host/, which the vlm_service role and\n"
              "# `vlfleet rollout` run); local changes are overwritten.\n"
              "# Service settings (service/runtime/settings.py documents every VLFLEET_* variable). Read by systemd "
              "(EnvironmentFile=).\n")
_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def env_text(settings: dict) -> str:
    """The env file's text: the header, then NAME=value, sorted by name. A VLFLEET_* name the host side does not
    read is refused (the service would refuse to start on it), with the nearest one it reads."""
    lines = []
    for name, value in sorted(settings.items()):
        text = str(value)
        if not _ENV_NAME_RE.match(name) or "\n" in text:
            raise HostError(f"env file: {name}={text!r} is not a NAME=value line (capitals, digits, '_'; one line)")
        lines.append(f"{name}={text}\n")
    if unknown := [name for name in sorted(settings) if name.startswith("VLFLEET_") and name not in SETTING_NAMES]:
        raise HostError("env file: " + "; ".join(_unknown_setting(name) for name in unknown)
                         + ". Nothing on the host reads it and the service refuses to start on it: fix the name or "
                           "remove it (vlm_service_extra_env; `vlfleet rollout --env NAME=` removes one)")
    return ENV_HEADER + "".join(lines)


def _unknown_setting(name: str) -> str:
    near = difflib.get_close_matches(name, SETTING_NAMES, n=1)
    return f"{name} is not a setting" + (f" (did you mean {near[0]}?)" if near else "")


def merged_env(base: dict[str, str], changes: dict) -> dict[str, str]:
    """``base`` with ``changes`` applied: a value replaces, an empty one (or null) removes the setting."""
    removed = {name for name, value in changes.items() if value is None or value == ""}
    return {name: str(value) for name, value in {**base, **changes}.items() if name not in removed}


def env_changes(running: dict[str, str], written: dict[str, str]) -> dict[str, dict]:
    """The settings whose value differs between the running release's env file and a new one (the release id aside):
    what a `vlfleet site` after a `vlfleet rollout --env` reverts unless the inventory has it too."""
    names = sorted((set(running) | set(written)) - {"VLFLEET_RELEASE_ID"})
    return {n: {"from": running.get(n), "to": written.get(n)} for n in names if running.get(n) != written.get(n)}


def write_env(args: dict) -> dict:
    """Write the release's env file: every setting (``settings``, the vlm_service role's: the answer's
    ``env_changes`` say what differs from the running release's), or ``changes`` on top of the env file of release
    ``env_from`` (default: the one `current` points at; what `vlfleet rollout` sends, so host-specific settings
    survive a rollout)."""
    root, release, rel = release_dir(args)
    running = link_target(root / "current")
    answer: dict = {"release": release}
    if args.get("settings") is not None:
        settings = {k: str(v) for k, v in args["settings"].items()}
        answer["env_changes"] = env_changes(read_env(root / "current" / "vlfleet.env") if running else {}, settings)
    else:
        base = args.get("env_from") or running
        settings = merged_env(read_env(root / "releases" / check_id(base) / "vlfleet.env") if base else {},
                              args.get("changes") or {})
    data = env_text(settings).encode()
    check = flag(args, "check")
    try:
        gid = group_id(args.get("group", "vlfleet"))
        if not rel.is_dir():
            raise HostError(f"release {release} is not on this host: make its venv first")
    except HostError:
        if check:  # the group and the release come with the converge this check previews
            return {"changed": True, **answer}
        raise
    return {"changed": write_atomic(rel / "vlfleet.env", data, 0o640, gid, check), **answer}

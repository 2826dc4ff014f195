"""The host side of vlfleet, as root: one subcommand per step, JSON in (one argument), JSON out (last line).

The one owner of the release steps on a host: the layout (`<root>/releases/<id>/{venv,vlfleet.env}`, `current`,
`previous`, the markers of a finished venv), the venv build from a wheelhouse, the env file (its only writer), the
switch, pruning, the start gate and its smoke answer. Two callers run this same file with the distribution's
python3, so hosts need nothing installed for it:
- Fabric (ops/fleet/transport.py) ships its source with each call (`python3 -c <source> CMD ARGS`);
- the roles (python_runtime, model_artifact, vlm_service) and ops/playbooks/rollout.yml run it with
  `ansible.builtin.script` and read `changed` from its answer; with `"check": true` a step that would change
  something says so and changes nothing (Ansible's check mode).
The unit tests run it against temporary directories. Standard library only; Python 3.10. What it must agree on
with the service (the engine names, the default engine, the VLFLEET_* names a host reads) is service/contract.py's,
copied below as literals because no service code is on the host's python3 path (tests/unit/test_contract.py keeps
the copy equal).

ARGS is the JSON object, base64-encoded (what Fabric sends) or as is (a string starting with "{").

Subcommands (see `COMMANDS`): release steps venv, env, switch, gate, prune, and the composites Fabric uses (stage =
venv + env, activate = switch + restart + gate); describe, place, quiesce, probe; for `vlfleet tune`, tune_info,
set_engine, peak, write_record (service hosts); lb (the nginx host: mark upstream servers drained or back in
rotation).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

COMPLETE = ".vlfleet-complete"  # python_runtime's marker of a finished venv
WHEELHOUSE_MARK = ".vlfleet-wheelhouse"  # sha256 of the requirements.txt the venv was built from
# A 64x64 grey PNG: the smoke request goes through the vision path like a user's would.
SMOKE_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAAlC+aJAAAATUlEQVR42u3PQQ0AAAgEIDX5RTeFDzdoQCepz6aeExAQEBAQEBAQEBAQ"
             "EBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQELi3oiwCAJt186UAAAAASUVORK5CYII=")
SMOKE_TOKENS = 4
_ID_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")

# -- contract: begin (generated from service/settings.py by `python -m service.contract`; do not edit)
# VLFLEET_ENGINE's choices (service/settings.py), the default first
ENGINES = (
    "direct", "serial", "batching", "llamacpp", "hybrid",
)
DEFAULT_ENGINE = "direct"  # what the service runs when no env file sets VLFLEET_ENGINE
# every VLFLEET_* name the host side reads (settings, launcher)
SETTING_NAMES = (
    "VLFLEET_MODEL_DIR", "VLFLEET_MODEL_NAME", "VLFLEET_HOST", "VLFLEET_PORT", "VLFLEET_DEVICE", "VLFLEET_ENGINE",
    "VLFLEET_LLAMACPP_SERVER", "VLFLEET_LLAMACPP_LIB", "VLFLEET_LLAMACPP_MODEL_DIR", "VLFLEET_LLAMACPP_CTX",
    "VLFLEET_LLAMACPP_START_TIMEOUT", "VLFLEET_LLAMACPP_RESTARTS", "VLFLEET_MAX_BATCH", "VLFLEET_KV_CACHE_GB",
    "VLFLEET_THREADS", "VLFLEET_PRECISION", "VLFLEET_LM_PRECISION", "VLFLEET_KV_PRECISION", "VLFLEET_DQ_GROUP_SIZE",
    "VLFLEET_HTTP_THREADS", "VLFLEET_QUEUE_SIZE", "VLFLEET_QUEUE_TIMEOUT", "VLFLEET_MAX_TOKENS",
    "VLFLEET_IMAGE_MAX_SIDE", "VLFLEET_IMAGE_MAX_SIDE_LOW", "VLFLEET_IMAGE_MAX_SIDE_HIGH", "VLFLEET_MAX_IMAGES",
    "VLFLEET_MAX_INPUT_TOKENS", "VLFLEET_MAX_TURNS", "VLFLEET_MAX_CONVERSATION_IMAGES", "VLFLEET_MAX_IMAGE_BYTES",
    "VLFLEET_MAX_IMAGE_PIXELS", "VLFLEET_MAX_BODY_BYTES", "VLFLEET_IMAGE_URL_DOMAINS", "VLFLEET_API_KEYS_FILE",
    "VLFLEET_MODEL_CACHE_DIR", "VLFLEET_ANSWER_CACHE_MB", "VLFLEET_IMAGE_CACHE_MB", "VLFLEET_ANSWER_CACHE_ENTRIES",
    "VLFLEET_MEMORY_LIMIT_MB", "VLFLEET_MEMORY_HIGH_WATER", "VLFLEET_SYSTEM_MEMORY_HIGH_WATER",
    "VLFLEET_MEMORY_LOW_WATER", "VLFLEET_WARMUP", "VLFLEET_RELEASE_ID", "VLFLEET_LOG_LEVEL",
    "VLFLEET_VERIFY_HASHES", "VLFLEET_SKIP_ARTIFACT_CHECK", "VLFLEET_CPUS", "VLFLEET_CPU_PLAN_FILE",
)
# -- contract: end


class AgentError(RuntimeError):
    """A step cannot be done; the message says why (it becomes the host's result line)."""


# ---------------------------------------------------------------------------------------------------------------
# Release tree: <root>/releases/<id>/{venv,vlfleet.env}, <root>/current and <root>/previous -> releases/<id>


def check_id(release: str) -> str:
    if not _ID_RE.match(release or ""):
        raise AgentError(f"release id {release!r}: use letters, digits, '.', '_' and '-' (at most 64)")
    return release


def link_target(link: Path) -> str | None:
    """The release id a `current`/`previous` symlink points at, or None."""
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return env
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def wheelhouse_sha(root: Path, release: str) -> str | None:
    """sha256 of the requirements.txt a release's venv was built from (our marker, else the role's wheelhouse)."""
    mark = root / "releases" / release / "venv" / WHEELHOUSE_MARK
    if mark.is_file():
        return mark.read_text().strip() or None
    return _sha256_file(root / "wheelhouses" / release / "requirements.txt")


def describe(args: dict) -> dict:
    root = Path(args["root"])
    releases = []
    rel_dir = root / "releases"
    for d in sorted(rel_dir.iterdir() if rel_dir.is_dir() else [], key=lambda p: p.stat().st_mtime):
        if d.is_dir():
            releases.append({"id": d.name, "complete": (d / "venv" / COMPLETE).is_file(),
                             "wheelhouse_sha": wheelhouse_sha(root, d.name), "mtime": d.stat().st_mtime})
    current = link_target(root / "current")
    models_dir = root / "models"
    return {
        "current": current,
        "previous": link_target(root / "previous"),
        "releases": releases,
        "env": read_env(root / "releases" / current / "vlfleet.env") if current else {},
        "models": sorted(p.name for p in models_dir.iterdir() if (p / "manifest.json").is_file())
        if models_dir.is_dir() else [],
    }


def _write_atomic(path: Path, data: bytes, mode: int, gid: int = 0, check: bool = False) -> bool:
    """Write ``path`` (root:``gid``, ``mode``) through a temporary file and rename; return whether the content, mode
    or owner changed. With ``check``, only say whether it would."""
    try:
        st = path.stat()
        same = path.read_bytes() == data and (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, 0, gid)
    except OSError:
        same = False
    if same or check:
        return not same
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chown(tmp, 0, gid)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def _group_id(name: str) -> int:
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise AgentError(f"group {name!r} does not exist: converge the host with site.yml first") from None


def flag(args: dict, name: str) -> bool:
    """A boolean argument; "false"/"no"/"0" (as a template may pass them) are false."""
    value = args.get(name)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "no", "0", "none")
    return bool(value)


def _release_dir(args: dict) -> tuple[Path, str, Path]:
    root = Path(args["root"])
    release = check_id(args["release"])
    return root, release, root / "releases" / release


# -- the venv: built once per release from a wheelhouse (or hard-linked from an identical one), then never changed


def venv(args: dict) -> dict:
    """Make `releases/<id>/venv` unless it is complete: hard-linked from release ``venv_from``, or built offline with
    hash checking from a wheelhouse (a directory, ``wheelhouse``, or a tar of one, ``wheelhouse_tar``, which is
    removed afterwards). Marked complete only at the end: a half-built venv is built again by the next call.
    With ``prepare`` and no source, only make the release directory and say whether the venv is complete."""
    root, release, rel = _release_dir(args)
    env_dir = rel / "venv"
    if (env_dir / COMPLETE).is_file():
        return {"changed": False, "complete": True, "release": release, "venv": "kept"}
    source = args.get("venv_from")
    build = bool(source or args.get("wheelhouse") or args.get("wheelhouse_tar"))
    if flag(args, "check"):
        return {"changed": True, "complete": False, "release": release, "venv": "to be made"}
    started = time.monotonic()
    created = not rel.is_dir()
    rel.mkdir(parents=True, exist_ok=True)
    os.chmod(rel, 0o755)
    if not build and flag(args, "prepare"):  # the roles: the directory the wheelhouse archive is sent to
        return {"changed": created, "complete": False, "release": release, "venv": "to be built"}
    shutil.rmtree(env_dir, ignore_errors=True)  # a half-made venv from an interrupted attempt
    if source:
        src = root / "releases" / check_id(source) / "venv"
        if not (src / COMPLETE).is_file():
            raise AgentError(f"release {source} has no complete venv to copy")
        # Finished venvs never change, so hard links are safe and cost no disk; `python -m` does not care about the
        # venv's path (only console-script shebangs name the source venv, and none are used).
        _run(["cp", "-al", str(src), str(env_dir)])
        sha = wheelhouse_sha(root, source)
        how = f"copied from {source}"
    elif args.get("wheelhouse") or args.get("wheelhouse_tar"):
        sha = _build_venv(rel, args)
        how = "built from the wheelhouse"
    else:
        raise AgentError(f"release {release} has no venv yet: pass a wheelhouse or a release to copy it from")
    (env_dir / WHEELHOUSE_MARK).write_text((sha or "") + "\n")
    (env_dir / COMPLETE).touch()
    return {"changed": True, "complete": True, "release": release, "venv": how,
            "seconds": round(time.monotonic() - started, 1)}


def _build_venv(rel: Path, args: dict) -> str | None:
    """`python -m venv` + `pip install --no-index --require-hashes` from the wheelhouse; its requirements' sha256."""
    tar = Path(args["wheelhouse_tar"]) if args.get("wheelhouse_tar") else None
    wh = rel / "wheelhouse" if tar else Path(args["wheelhouse"])
    if tar:
        if not tar.is_file():
            raise AgentError(f"no wheelhouse archive at {tar}")
        shutil.rmtree(wh, ignore_errors=True)
        wh.mkdir()
        _run(["tar", "-xf", str(tar), "-C", str(wh)], timeout=600)
    req = wh / "requirements.txt"
    if not req.is_file():
        raise AgentError(f"no wheelhouse at {wh} (requirements.txt missing)")
    python = args.get("python") or "/usr/bin/python3"
    env_dir = rel / "venv"
    _run([python, "-m", "venv", str(env_dir)])
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--no-cache-dir",
          "--disable-pip-version-check", "--find-links", str(wh), "--require-hashes", "-r", str(req)], timeout=1800)
    sha = _sha256_file(req)
    if tar:
        shutil.rmtree(wh, ignore_errors=True)
        tar.unlink(missing_ok=True)
    return sha


# -- the env file: `releases/<id>/vlfleet.env`, root:<group> 0640; this is its only writer

ENV_HEADER = ("# Managed by vlfleet (the env step of ops/fleet/host_agent.py, which the vlm_service role and\n"
              "# `vlfleet rollout` run); local changes are overwritten.\n"
              "# Service settings (service/settings.py documents every VLFLEET_* variable). Read by systemd "
              "(EnvironmentFile=).\n")
_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def env_text(settings: dict) -> str:
    """The env file's text: the header, then NAME=value, sorted by name. A VLFLEET_* name the host side does not
    read is refused (the service would refuse to start on it), with the nearest one it reads."""
    lines = []
    for name, value in sorted(settings.items()):
        text = str(value)
        if not _ENV_NAME_RE.match(name) or "\n" in text:
            raise AgentError(f"env file: {name}={text!r} is not a NAME=value line (capitals, digits, '_'; one line)")
        lines.append(f"{name}={text}\n")
    unknown = [name for name in sorted(settings) if name.startswith("VLFLEET_") and name not in SETTING_NAMES]
    if unknown:
        raise AgentError("env file: " + "; ".join(_unknown_setting(name) for name in unknown)
                         + ". Nothing on the host reads it and the service refuses to start on it: fix the name or "
                           "remove it (vlm_service_extra_env; `vlfleet rollout --env NAME=` removes one)")
    return ENV_HEADER + "".join(lines)


def _unknown_setting(name: str) -> str:
    near = difflib.get_close_matches(name, SETTING_NAMES, n=1)
    return f"{name} is not a setting" + (f" (did you mean {near[0]}?)" if near else "")


def merged_env(base: dict[str, str], changes: dict) -> dict[str, str]:
    """``base`` with ``changes`` applied: a value replaces, an empty one (or null) removes the setting."""
    merged = dict(base)
    for name, value in changes.items():
        if value is None or value == "":
            merged.pop(name, None)
        else:
            merged[name] = str(value)
    return merged


def write_env(args: dict) -> dict:
    """Write the release's env file: every setting (``settings``, the vlm_service role's), or ``changes`` on top of
    the env file of release ``env_from`` (default: the one `current` points at; what `vlfleet rollout` sends, so
    host-specific settings survive a rollout)."""
    root, release, rel = _release_dir(args)
    if args.get("settings") is not None:
        settings = {k: str(v) for k, v in args["settings"].items()}
    else:
        base = args.get("env_from") or link_target(root / "current")
        settings = merged_env(read_env(root / "releases" / check_id(base) / "vlfleet.env") if base else {},
                              args.get("changes") or {})
    data = env_text(settings).encode()
    check = flag(args, "check")
    try:
        gid = _group_id(args.get("group", "vlfleet"))
    except AgentError:
        if check:  # the group comes with the converge this check previews
            return {"changed": True, "release": release}
        raise
    if not rel.is_dir():
        if check:
            return {"changed": True, "release": release}
        raise AgentError(f"release {release} is not on this host: make its venv first")
    return {"changed": _write_atomic(rel / "vlfleet.env", data, 0o640, gid, check), "release": release}


def stage(args: dict) -> dict:
    """Prepare a release next to the running one without touching it: venv, then env file (with ``changes`` or
    ``settings``, as `env`). What `vlfleet rollout` does first on a host."""
    started = time.monotonic()
    made = venv(args)
    env_changed = False
    if args.get("changes") is not None or args.get("settings") is not None:
        env_changed = write_env(args)["changed"]
    return {"release": made["release"], "venv": made["venv"], "env_changed": env_changed,
            "changed": made["changed"] or env_changed, "seconds": round(time.monotonic() - started, 1)}


def place(args: dict) -> dict:
    """Move an uploaded directory (wheelhouse or model artifact) into place, verifying an artifact first."""
    src = Path(args["src"])
    dest = Path(args["dest"])
    if dest.exists():
        shutil.rmtree(src, ignore_errors=True)
        return {"placed": False, "dest": str(dest)}
    if not src.is_dir():
        raise AgentError(f"upload {src} is missing")
    _run(["chown", "-R", "root:root", str(src)])
    if args.get("verify_with"):
        done = subprocess.run([args["verify_with"], "-m", "service.manifest", "verify", "--full", str(src)],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            shutil.rmtree(src, ignore_errors=True)
            raise AgentError("the uploaded artifact does not match its manifest: "
                             f"{(done.stdout + done.stderr).strip()[-600:]}")
        _run(["chmod", "-R", "a-w,a+rX", str(src)])
    else:
        _run(["chmod", "-R", "go-w,a+rX", str(src)])
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dest)
    return {"placed": True, "dest": str(dest)}


# -- current and previous


def switch(root: Path, release: str) -> str | None:
    """Point `current` at ``release`` (atomic rename of a new symlink); `previous` keeps the old target."""
    rel = root / "releases" / check_id(release)
    if not (rel / "venv" / COMPLETE).is_file() or not (rel / "vlfleet.env").is_file():
        raise AgentError(f"release {release} is not staged on this host (venv or vlfleet.env missing)")
    old = link_target(root / "current")
    if old == release:
        return old
    if old:
        _symlink_atomic(root / "releases" / old, root / "previous")
    _symlink_atomic(rel, root / "current")
    return old


def switch_step(args: dict) -> dict:
    """`switch` as a step: {"changed", "from", "current", "previous"}; with ``check``, what it would do."""
    root, release, _rel = _release_dir(args)
    old = link_target(root / "current")
    if old != release and not flag(args, "check"):
        switch(root, release)
    return {"changed": old != release, "from": old, "current": release,
            "previous": old if old and old != release else link_target(root / "previous")}


def _symlink_atomic(target: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(str(target), tmp)
    os.replace(tmp, link)


# -- pruning


def prune(args: dict) -> dict:
    """Keep the newest ``keep`` directories (by mtime) of `releases/` (``kind`` "releases", the default; a removed
    release's uploaded wheelhouse goes too) or `models/` ("models"), never one named in ``protect``, nor what
    `current` and `previous` use (their releases, and the models their env files name). ``check``: only say."""
    root = Path(args["root"])
    kind = args.get("kind", "releases")
    if kind not in ("releases", "models"):
        raise AgentError(f"prune: kind {kind!r}: use releases or models")
    keep = max(int(args.get("keep", 3)), 1)
    in_use = [r for r in (link_target(root / "current"), link_target(root / "previous")) if r]
    protected = set(args.get("protect") or [])
    if kind == "releases":
        protected.update(in_use)
    else:
        envs = [read_env(root / "releases" / r / "vlfleet.env") for r in in_use]
        protected.update(Path(env.get(name, "")).name for env in envs
                         for name in ("VLFLEET_MODEL_DIR", "VLFLEET_LLAMACPP_MODEL_DIR"))
    base = root / kind
    dirs = sorted((d for d in base.iterdir() if d.is_dir() and not d.is_symlink()), key=lambda p: p.stat().st_mtime,
                  reverse=True) if base.is_dir() else []
    removed = [d.name for d in dirs[keep:] if d.name not in protected]
    if not flag(args, "check"):
        for name in removed:
            shutil.rmtree(base / name)
            if kind == "releases":
                shutil.rmtree(root / "wheelhouses" / name, ignore_errors=True)
    return {"changed": bool(removed), "removed": removed, "kept": [d.name for d in dirs if d.name not in removed]}


# ---------------------------------------------------------------------------------------------------------------
# The service: restart, readiness gate, smoke answer, drain wait, status probe


def _run(argv: list[str], timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AgentError(f"{' '.join(argv[:3])} failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-600:]}")
    return done.stdout


def unit_state(unit: str) -> dict[str, str]:
    out = _run(["systemctl", "show", f"{unit}.service", "-p",
                "ActiveState,SubState,MainPID,NRestarts,ControlGroup,ExecMainStatus"])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal_tail(unit: str, since: float | None = None, lines: int = 25) -> list[str]:
    argv = ["journalctl", "-u", f"{unit}.service", "-n", str(lines), "--no-pager", "-o", "cat"]
    if since:
        argv += ["--since", f"@{int(since)}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return done.stdout.splitlines()[-lines:]


def service_address(env: dict[str, str]) -> tuple[str, int]:
    host = env.get("VLFLEET_HOST", "127.0.0.1")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, int(env.get("VLFLEET_PORT", "8000"))


def api_key(env: dict) -> str | None:
    """The first key of the service's VLFLEET_API_KEYS_FILE, so probes pass when keys are required."""
    path = env.get("VLFLEET_API_KEYS_FILE")
    if not path:
        return None
    try:
        with open(path) as f:
            keys = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return None
    return keys[0] if keys else None


def request(addr: tuple[str, int], method: str, path: str, body: dict | None = None,
            timeout: float = 10, key: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload else {}
        if key:
            headers["Authorization"] = "Bearer " + key
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def readyz(addr: tuple[str, int]) -> tuple[int, dict]:
    try:
        status, raw = request(addr, "GET", "/readyz", timeout=5)
        return status, json.loads(raw or b"{}")
    except (OSError, ValueError) as e:
        return 0, {"reason": f"{type(e).__name__}: {e}"}


def smoke(addr: tuple[str, int], timeout: float, key: str | None = None) -> dict:
    """A real answer: one image and a question, a fixed number of tokens (the model's words may be noise)."""
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + SMOKE_PNG}},
        # a nonce: the service replays identical deterministic requests from its answer cache
        {"type": "text", "text": f"What is in this picture? ({time.time():.6f})"}]}],
        "max_tokens": SMOKE_TOKENS, "ignore_eos": True, "stream": False}
    started = time.monotonic()
    try:
        status, raw = request(addr, "POST", "/v1/chat/completions", body, timeout=timeout, key=key)
    except OSError as e:
        return {"ok": False, "reason": f"smoke request failed: {type(e).__name__}: {e}"}
    seconds = round(time.monotonic() - started, 2)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = {}
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    if status != 200 or tokens != SMOKE_TOKENS:
        return {"ok": False, "reason": f"smoke answer: HTTP {status}, {tokens} tokens (want {SMOKE_TOKENS}): "
                                       f"{raw[:300].decode(errors='replace')}", "seconds": seconds}
    return {"ok": True, "tokens": tokens, "seconds": seconds}


LOAD_FAILED = "model failed to load"  # service/engine/base.py's /readyz reason: the engine will not retry


def wait_ready(addr: tuple[str, int], unit: str, accept, timeout: float, since: float | None, restarts: int,
               poll: float = 1.0) -> dict:
    """Wait (bounded) for /readyz 200 with a body ``accept`` takes; fail fast when the unit crashes meanwhile or
    the engine reports that it gave up (its model failed to load, its llama-server died while loading).
    {"ok": True, "ready_s", "readyz"} or {"ok": False, "reason", "journal"}."""
    started = time.monotonic()
    while True:
        status, last = readyz(addr)
        if status == 200 and accept(last):
            return {"ok": True, "ready_s": round(time.monotonic() - started, 1), "readyz": last}
        # The process lives on, never ready (the engine gave up: /readyz "failed", or a release from before that
        # field whose model failed to load): stop waiting.
        if last.get("failed") is True or str(last.get("reason", "")).startswith(LOAD_FAILED):
            return {"ok": False, "reason": f"/readyz {status}: {last['reason']}", "journal": journal_tail(unit, since)}
        state = unit_state(unit)
        crashed = (state.get("ActiveState") in ("failed", "inactive") or state.get("SubState") == "auto-restart"
                   or int(state.get("NRestarts") or 0) > restarts)
        if crashed or time.monotonic() - started >= timeout:
            why = (f"the service exited ({state.get('ActiveState')}/{state.get('SubState')}, "
                   f"exit status {state.get('ExecMainStatus')})" if crashed
                   else f"not ready after {timeout:.0f} s (last /readyz: {status or 'no answer'} "
                        f"{last.get('reason', '')})")
            return {"ok": False, "reason": why, "journal": journal_tail(unit, since)}
        time.sleep(poll)


def gate(root: Path, unit: str, release: str | None, timeout: float, since: float | None, restarts: int,
         poll: float = 1.0, smoke_answer: bool = True) -> dict:
    """Wait (bounded) for /readyz 200 naming ``release``, then a smoke answer; fail fast when the unit crashes."""
    env = read_env(root / "current" / "vlfleet.env")
    addr = service_address(env)
    deadline = time.monotonic() + timeout
    ready = wait_ready(addr, unit, lambda body: release is None or body.get("release_id") == release, timeout, since,
                       restarts, poll)
    if not ready["ok"] or not smoke_answer:
        return ready
    result = smoke(addr, timeout=max(30.0, deadline - time.monotonic()), key=api_key(env))
    if not result["ok"]:
        return {"ok": False, "reason": result["reason"], "journal": journal_tail(unit, since),
                "readyz": ready["readyz"]}
    return {"ok": True, "ready_s": ready["ready_s"], "smoke": result, "readyz": ready["readyz"]}


def restart_unit(unit: str, stop_timeout: float = 120) -> int:
    """Restart the unit (clearing a start limit first); its restart count after, for telling a crash loop."""
    # A crash-looping release may have hit the unit's start limit; a deliberate restart must not be refused.
    subprocess.run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, timeout=30)
    _run(["systemctl", "restart", f"{unit}.service"], timeout=stop_timeout)
    return int(unit_state(unit).get("NRestarts") or 0)


def activate(args: dict) -> dict:
    """Switch `current` (when a release is given), restart the unit, then gate it."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    release = args.get("release")
    old = switch(root, release) if release else link_target(root / "current")
    since = time.time()
    restarts = restart_unit(unit, float(args.get("stop_timeout", 120)))
    result = gate(root, unit, release or link_target(root / "current"), float(args.get("timeout", 600)), since,
                  restarts)
    result.update({"release": link_target(root / "current"), "from": old})
    return result


def gate_step(args: dict) -> dict:
    """The start gate after the roles' restart (or none): /readyz 200 naming ``release`` within ``timeout``, then a
    smoke answer; an error with the reason and the unit's last journal lines otherwise. With ``check`` (the switch
    was only previewed): readiness of whatever runs, no smoke request."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    check = flag(args, "check")
    release = None if check else args.get("release")
    timeout = float(args.get("timeout", 600))
    restarts = int(unit_state(unit).get("NRestarts") or 0)
    result = gate(root, unit, release, timeout, None, restarts, smoke_answer=not check)
    if not result["ok"]:
        journal = "\n".join(result.get("journal") or journal_tail(unit, lines=40))
        raise AgentError(f"{unit} did not pass its start gate within {timeout:.0f} s: {result['reason']}\n"
                         f"Last journal lines (journalctl -u {unit}):\n{journal}")
    smoke_result = result.get("smoke") or {}
    return {"changed": False, "release": link_target(root / "current"), "ready_s": result["ready_s"],
            "smoke_tokens": smoke_result.get("tokens"), "smoke_s": smoke_result.get("seconds")}


def established_clients(port: int, proc: Path = Path("/proc/net")) -> int:
    """Established TCP connections to local ``port`` from other hosts (the lb's proxied requests, streams included;
    our own loopback probes are not counted)."""
    count = 0
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state != "01" or int(local.rsplit(":", 1)[1], 16) != port:
                continue
            if _is_loopback_hex(remote.rsplit(":", 1)[0]):
                continue
            count += 1
    return count


def _is_loopback_hex(addr: str) -> bool:
    if len(addr) == 8:  # IPv4, little-endian: 127.x.x.x has 7F as its last byte
        return addr[6:8] == "7F"
    # IPv6 ::1, or an IPv4-mapped ::ffff:127.x.x.x
    return addr == "00000000000000000000000001000000" or (addr[:24] == "0000000000000000FFFF0000" and addr[30:] == "7F")


def quiesce(args: dict) -> dict:
    """After the lb stopped sending new requests: wait (bounded) until the requests in flight have finished."""
    root = Path(args["root"])
    addr = service_address(read_env(root / "current" / "vlfleet.env"))
    timeout = float(args.get("timeout", 60))
    started = time.monotonic()
    left = -1
    while time.monotonic() - started < timeout:
        left = established_clients(addr[1])
        _status, body = readyz(addr)
        left = max(left, int(body.get("queue_depth") or 0))
        if left == 0:
            break
        time.sleep(0.5)
    return {"left": left, "waited_s": round(time.monotonic() - started, 1)}


# What the fleet report's cache locality panel reads (ops/report/collect.py).
LOCALITY_METRICS = ("vlfleet_answer_cache_hits_total", "vlfleet_answer_cache_misses_total",
                    "vlfleet_vision_encoder_runs_total", "vlfleet_prompt_images_total",
                    "vlfleet_reused_prompt_tokens_total", "vlfleet_prompt_tokens_total", "vlfleet_session_reuse_total")


def probe(args: dict) -> dict:
    """What `vlfleet status` shows for one host."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    out: dict[str, Any] = {"release": link_target(root / "current"), "previous": link_target(root / "previous")}
    try:
        state = unit_state(unit)
    except AgentError as e:
        state = {"error": str(e)}
    out["unit"] = {k: state.get(k) for k in ("ActiveState", "SubState", "MainPID", "NRestarts")}
    out["rss_bytes"] = cgroup_rss(state.get("ControlGroup") or "")
    record = _read_json(Path(args["record"])) if args.get("record") else None
    out["tuned_engine"] = record.get("engine") if isinstance(record, dict) else None
    env = read_env(root / "current" / "vlfleet.env")
    addr = service_address(env)
    out["readyz_status"], out["readyz"] = readyz(addr)
    try:
        status, raw = request(addr, "GET", "/metrics", timeout=5, key=api_key(env))
        keep = ("vlfleet_time_to_first_token_seconds", "vlfleet_model_info", *LOCALITY_METRICS)
        out["metrics"] = "\n".join(line for line in raw.decode(errors="replace").splitlines()
                                   if line.startswith(keep)) if status == 200 else ""
    except OSError:
        out["metrics"] = ""
    return out


def cgroup_pids(cgroup: str, fs: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """The processes of a unit's cgroup (its ControlGroup property)."""
    if not cgroup:
        return []
    # cgroup v2 at the root; hybrid layouts (some containers) keep the unit's processes under unified/ or systemd/
    for base in (fs, fs / "unified", fs / "systemd"):
        try:
            return (base / cgroup.lstrip("/") / "cgroup.procs").read_text().split()
        except OSError:
            continue
    return []


def cgroup_rss(cgroup: str, fs: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc"),
               field: str = "VmRSS:") -> int | None:
    """Sum of VmRSS (or another /proc/PID/status field in kB, e.g. VmHWM: the peak) over the unit's processes (the
    gunicorn master, its worker, and a llama-server child when there is one)."""
    pids = cgroup_pids(cgroup, fs)
    if not pids:
        return None
    total = 0
    for pid in pids:
        try:
            for line in (proc / pid / "status").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


# ---------------------------------------------------------------------------------------------------------------
# Engine tuning (`vlfleet tune`, ops/fleet/tune.py): the override env file the unit reads after the release's,
# restart on an engine, peak memory, the record of the choice

# Where the release wheelhouse's vlfleet-llama-server wheel (ops/llamacpp/wheel.py) puts llama-server in the venv.
RUNTIME_GLOB = "lib/python3*/site-packages/vlfleet_llama_server/bin/llama-server"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _memory_property(value: str | None) -> int | None:
    """A systemd MemoryHigh/MemoryMax value in bytes; None when unset ("infinity") or unknown."""
    return int(value) if value and value.isdigit() else None


def tune_info(args: dict) -> dict:
    """What tune needs before it changes anything: the release's env, the override and record as they are, the
    unit's memory limits, the host's memory, and whether the llama-server binary the env names exists."""
    root = Path(args["root"])
    env = read_env(root / "current" / "vlfleet.env")
    override = Path(args["override"])
    props = _run(["systemctl", "show", f"{args.get('unit', 'vlfleet')}.service", "-p", "MemoryHigh,MemoryMax"])
    limits = dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
    mem_total = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:")), None)
    return {"release": link_target(root / "current"), "env": env,
            "override": read_env(override) if override.is_file() else None,
            "record": _read_json(Path(args["record"])),
            "memory_high": _memory_property(limits.get("MemoryHigh")),
            "memory_max": _memory_property(limits.get("MemoryMax")), "mem_total": mem_total,
            "llama_server": llama_server(root, env)}


def llama_server(root: Path, env: dict) -> dict:
    """The llama-server the llamacpp engine would run (the env's, else the one the release's wheelhouse put in its
    venv) and the GGUF artifact it would serve, each with whether it is there."""
    server = env.get("VLFLEET_LLAMACPP_SERVER", "") or next(
        (str(p) for p in sorted((root / "current" / "venv").glob(RUNTIME_GLOB))), "")
    model = env.get("VLFLEET_LLAMACPP_MODEL_DIR", "")
    return {"path": server, "exists": bool(server) and os.access(server, os.X_OK),
            "model_dir": model, "model_exists": bool(model) and (Path(model) / "manifest.json").is_file()}


def override_text(engine: str) -> str:
    if engine not in ENGINES:
        raise AgentError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    return ("# Managed by `vlfleet tune` (its record: tuned.json beside this file). Read by the unit after the\n"
            f"# release's vlfleet.env, so it wins over VLFLEET_ENGINE there.\nVLFLEET_ENGINE={engine}\n")


def set_engine(args: dict) -> dict:
    """Run the service on an engine: write the override env file (no engine: remove it, the release's env decides),
    restart, and wait (bounded) for /readyz 200 reporting that engine."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    override = Path(args["override"])
    engine = args.get("engine")
    if engine:
        override.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(override, override_text(engine).encode(), 0o644)
    else:
        override.unlink(missing_ok=True)
    env = read_env(root / "current" / "vlfleet.env")
    expected = engine or env.get("VLFLEET_ENGINE") or DEFAULT_ENGINE
    since = time.time()
    restarts = restart_unit(unit, float(args.get("stop_timeout", 120)))
    # A release from before /readyz named its engine says nothing: take its word that it runs what it was told.
    result = wait_ready(service_address(env), unit, lambda body: body.get("engine", expected) == expected,
                        float(args.get("timeout", 600)), since, restarts)
    result["engine"] = expected
    return result


def peak(args: dict) -> dict:
    """Peak memory of the running service: the sum of its processes' VmHWM (the high-water RSS since each started),
    and the cgroup's memory.peak (page cache included) where the kernel has it."""
    state = unit_state(args.get("unit", "vlfleet"))
    cgroup = state.get("ControlGroup") or ""
    cg_peak = None
    for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        try:
            cg_peak = int((base / cgroup.lstrip("/") / "memory.peak").read_text())
            break
        except (OSError, ValueError):
            continue
    return {"peak_rss_bytes": cgroup_rss(cgroup, field="VmHWM:"), "rss_bytes": cgroup_rss(cgroup),
            "cgroup_peak_bytes": cg_peak}


def write_record(args: dict) -> dict:
    """Write tune's record (JSON, world-readable: it holds no secret); ``record`` None removes it."""
    path = Path(args["path"])
    if args.get("record") is None:
        path.unlink(missing_ok=True)
        return {"written": False}
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, (json.dumps(args["record"], indent=1) + "\n").encode(), 0o644)
    return {"written": True}


# ---------------------------------------------------------------------------------------------------------------
# The lb host: nginx upstream servers marked `down` (drained) or not, in the site the lb role rendered


def set_drained(text: str, drain: list[str], undrain: list[str]) -> tuple[str, list[str]]:
    """Mark the upstream servers of the named hosts `down` (drain) or not (undrain) in an nginx site rendered from
    templates/nginx-vlfleet.conf.j2: each server line follows a comment naming its host (`# c1` or
    `# c1 (drained)`). The result equals what the lb role renders with those hosts in lb_drained_hosts.
    Returns the new text and the hosts drained in it."""
    lines = text.split("\n")
    wanted = set(drain) | set(undrain)
    seen: set[str] = set()
    drained: list[str] = []
    comment = re.compile(r"^(\s*)# (\S+)( \(drained\))?$")
    for i, line in enumerate(lines[:-1]):
        m = comment.match(line)
        nxt = lines[i + 1]
        if not m or not nxt.lstrip().startswith("server "):
            continue
        indent, host, is_drained = m.group(1), m.group(2), bool(m.group(3))
        if host in wanted:
            seen.add(host)
            is_drained = host in drain
            server = re.sub(r" down;$", ";", nxt.rstrip())
            lines[i] = f"{indent}# {host}" + (" (drained)" if is_drained else "")
            lines[i + 1] = server[:-1] + " down;" if is_drained else server
        if is_drained and host not in drained:  # a host has a server line in each upstream block
            drained.append(host)
    missing = sorted(wanted - seen)
    if missing:
        raise AgentError(f"the nginx site has no upstream server for {', '.join(missing)}: converge the lb with "
                         f"site.yml so it lists every vlm host")
    return "\n".join(lines), drained


def lb(args: dict) -> dict:
    site = Path(args["site"])
    try:
        old = site.read_text()
    except OSError as e:
        raise AgentError(f"cannot read the nginx site {site}: {e}; converge the lb host with site.yml") from e
    new, drained = set_drained(old, list(args.get("drain", [])), list(args.get("undrain", [])))
    if new == old:
        return {"changed": False, "drained": drained}
    _write_atomic(site, new.encode(), 0o644)
    test = subprocess.run([args.get("nginx", "/usr/sbin/nginx"), "-t", "-q"], capture_output=True, text=True,
                          timeout=60)
    if test.returncode != 0:
        _write_atomic(site, old.encode(), 0o644)
        raise AgentError(f"nginx -t rejected the edited site (restored): {test.stderr.strip()[-400:]}")
    # reload, never restart: old workers finish their open streams, new ones skip the drained servers
    old = nginx_workers()
    _run(["systemctl", "reload", "nginx.service"], timeout=60)
    wait_workers_replaced(old)
    return {"changed": True, "drained": drained}


def nginx_workers(pidfile: Path = Path("/run/nginx.pid"), proc: Path = Path("/proc")) -> dict[int, str]:
    """nginx's worker processes (children of the master in ``pidfile``) and their titles."""
    try:
        master = pidfile.read_text().strip()
    except OSError:
        return {}
    workers = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            ppid = stat.read_text().rsplit(")", 1)[1].split()[1]
            if ppid == master:
                workers[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return workers


def wait_workers_replaced(old: dict[int, str], timeout: float = 10.0, **where) -> bool:
    """Bounded wait until every worker that ran before the reload is gone or shutting down: from then on no
    worker with the old site accepts a connection (systemctl reload returns once the master got the signal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = nginx_workers(**where)
        if all(pid not in now or "shutting down" in now[pid] for pid in old):
            return True
        time.sleep(0.05)
    return False


COMMANDS = {
    # the release steps (the roles call these one by one; Fabric, the composites stage and activate)
    "venv": venv, "env": write_env, "switch": switch_step, "gate": gate_step, "prune": prune,
    "stage": stage, "activate": activate,
    # fleet operations
    "describe": describe, "place": place, "quiesce": quiesce, "probe": probe, "lb": lb,
    "tune_info": tune_info, "set_engine": set_engine, "peak": peak, "write_record": write_record,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in COMMANDS:
        print(json.dumps({"error": f"usage: host_agent {{{','.join(COMMANDS)}}} BASE64-JSON|JSON"}))
        return 2
    try:
        args = json.loads(argv[1] if argv[1].lstrip().startswith("{") else base64.b64decode(argv[1]))
        result = COMMANDS[argv[0]](args)
    except AgentError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    except subprocess.TimeoutExpired as e:
        print(json.dumps({"error": f"{' '.join(map(str, e.cmd))[:80]} timed out after {e.timeout:.0f} s"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

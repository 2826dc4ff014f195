"""A release on a host: its venv (built once from a wheelhouse, or hard-linked from an identical release), the
switch of `current`, pruning, and placing uploaded wheelhouses and model artifacts."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

from .envfile import write_env
from .errors import HostError, flag
from .layout import COMPLETE, WHEELHOUSE_MARK, check_id, link_target, read_env, release_dir, wheelhouse_sha
from .system import run, sha256_file

PIP_WHEELS = "/usr/share/python-wheels"  # Debian's and Ubuntu's home of the wheels ensurepip installs


def describe(args: dict) -> dict:
    root = Path(args["root"])
    rel_dir, models_dir = root / "releases", root / "models"
    entries = sorted(rel_dir.iterdir() if rel_dir.is_dir() else [], key=lambda p: p.stat().st_mtime)
    current = link_target(root / "current")
    return {"current": current, "previous": link_target(root / "previous"),
            "releases": [{"id": d.name, "complete": (d / "venv" / COMPLETE).is_file(),
                          "wheelhouse_sha": wheelhouse_sha(root, d.name), "mtime": d.stat().st_mtime}
                         for d in entries if d.is_dir()],
            "env": read_env(root / "releases" / current / "vlfleet.env") if current else {},
            "models": sorted(p.name for p in models_dir.iterdir() if (p / "manifest.json").is_file())
            if models_dir.is_dir() else []}


def venv(args: dict) -> dict:
    """Make `releases/<id>/venv` unless it is complete: hard-linked from release ``venv_from``, or built offline with
    hash checking from a wheelhouse (a directory, ``wheelhouse``, or a tar of one, ``wheelhouse_tar``, which is
    removed afterwards). Marked complete only at the end: a half-built venv is built again by the next call.
    With ``prepare`` and no source, only make the release directory and say whether the venv is complete."""
    root, release, rel = release_dir(args)
    env_dir = rel / "venv"
    if (env_dir / COMPLETE).is_file():
        return {"changed": False, "complete": True, "release": release, "venv": "kept"}
    source = args.get("venv_from")
    wheelhouse = args.get("wheelhouse") or args.get("wheelhouse_tar")
    if flag(args, "check"):
        return {"changed": True, "complete": False, "release": release, "venv": "to be made"}
    started = time.monotonic()
    created = not rel.is_dir()
    rel.mkdir(parents=True, exist_ok=True)
    os.chmod(rel, 0o755)
    if not (source or wheelhouse) and flag(args, "prepare"):  # the roles: where the wheelhouse archive is sent
        return {"changed": created, "complete": False, "release": release, "venv": "to be built"}
    shutil.rmtree(env_dir, ignore_errors=True)  # a half-made venv from an interrupted attempt
    if source:
        src = root / "releases" / check_id(source) / "venv"
        if not (src / COMPLETE).is_file():
            raise HostError(f"release {source} has no complete venv to copy")
        # Finished venvs never change, so hard links are safe and cost no disk; `python -m` does not care about the
        # venv's path (only console-script shebangs name the source venv, and none are used).
        run(["cp", "-al", str(src), str(env_dir)])
        sha = wheelhouse_sha(root, source)
        how = f"copied from {source}"
    elif wheelhouse:
        sha = _build_venv(rel, args)
        how = "built from the wheelhouse"
    else:
        raise HostError(f"release {release} has no venv yet: pass a wheelhouse or a release to copy it from")
    (env_dir / WHEELHOUSE_MARK).write_text((sha or "") + "\n")
    (env_dir / COMPLETE).touch()
    return {"changed": True, "complete": True, "release": release, "venv": how,
            "seconds": round(time.monotonic() - started, 1)}


def pip_wheel() -> str | None:
    """The newest pip wheel ensurepip installs from (Debian and Ubuntu: python3-pip-whl's; upstream Python: its
    bundled one), or None."""
    found = glob.glob(os.path.join(PIP_WHEELS, "pip-*.whl")) + glob.glob(
        os.path.join(sysconfig.get_path("stdlib"), "ensurepip", "_bundled", "pip-*.whl"))
    return max(found, key=lambda w: [int(n) for n in re.findall(r"\d+", Path(w).name.split("-")[1])], default=None)


def _build_venv(rel: Path, args: dict) -> str | None:
    """`python -m venv` + `pip install --no-index --require-hashes` from the wheelhouse; its requirements' sha256."""
    tar = Path(args["wheelhouse_tar"]) if args.get("wheelhouse_tar") else None
    wh = rel / "wheelhouse" if tar else Path(args["wheelhouse"])
    if tar:
        if not tar.is_file():
            raise HostError(f"no wheelhouse archive at {tar}")
        shutil.rmtree(wh, ignore_errors=True)
        wh.mkdir()
        run(["tar", "-xf", str(tar), "-C", str(wh)], timeout=600)
    req = wh / "requirements.txt"
    if not req.is_file():
        raise HostError(f"no wheelhouse at {wh} (requirements.txt missing)")
    env_dir = rel / "venv"
    wheel = pip_wheel()
    # ensurepip would install pip into every release venv: a minute on an emulated host, for a tool the release
    # never runs. Run from the wheel ensurepip would install, pip installs into the venv without joining it.
    run([args.get("python") or "/usr/bin/python3", "-m", "venv", *(["--without-pip"] if wheel else []), str(env_dir)])
    pip = [f"{wheel}/pip"] if wheel else ["-m", "pip"]
    run([str(env_dir / "bin" / "python"), *pip, "install", "--quiet", "--no-index", "--no-cache-dir",
          "--disable-pip-version-check", "--find-links", str(wh), "--require-hashes", "-r", str(req)], timeout=1800)
    sha = sha256_file(req)
    if tar:
        shutil.rmtree(wh, ignore_errors=True)
        tar.unlink(missing_ok=True)
    return sha


def stage(args: dict) -> dict:
    """Prepare a release next to the running one without touching it: venv, then env file (with ``changes`` or
    ``settings``, as `env`). What `vlfleet rollout` does first on a host."""
    started = time.monotonic()
    made = venv(args)
    env_changed = (args.get("changes") is not None or args.get("settings") is not None) and write_env(args)["changed"]
    return {"release": made["release"], "venv": made["venv"], "env_changed": env_changed,
            "changed": made["changed"] or env_changed, "seconds": round(time.monotonic() - started, 1)}


def place(args: dict) -> dict:
    """Move an uploaded directory (wheelhouse or model artifact) into place, root-owned; an artifact
    (``verify_with``: the python that runs service.runtime.manifest) is verified first (``full``, the default: every
    file's sha256) and made read-only. What is already at ``dest`` is kept and the upload removed."""
    src, dest = Path(args["src"]), Path(args["dest"])
    if dest.exists():
        shutil.rmtree(src, ignore_errors=True)
        return {"placed": False, "dest": str(dest)}
    if not src.is_dir():
        raise HostError(f"upload {src} is missing")
    run(["chown", "-R", "root:root", str(src)])
    if args.get("verify_with"):
        full = ["--full"] if flag(args, "full", default=True) else []  # hashes too, not only names and sizes
        done = subprocess.run([args["verify_with"], "-m", "service.runtime.manifest", "verify", *full, str(src)],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            shutil.rmtree(src, ignore_errors=True)
            raise HostError(f"the copy of {dest.name} does not match its manifest: "
                            f"{(done.stdout + done.stderr).strip()[-600:]}. Check the controller's copy "
                            "(`vlfleet model.verify DIR`), then send it again")
    run(["chmod", "-R", "a-w,a+rX" if args.get("verify_with") else "go-w,a+rX", str(src)])  # an artifact: read-only
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dest)
    return {"placed": True, "dest": str(dest)}


def switch(root: Path, release: str) -> str | None:
    """Point `current` at ``release`` (atomic rename of a new symlink); `previous` keeps the old target."""
    rel = root / "releases" / check_id(release)
    if not (rel / "venv" / COMPLETE).is_file() or not (rel / "vlfleet.env").is_file():
        raise HostError(f"release {release} is not staged on this host (venv or vlfleet.env missing)")
    old = link_target(root / "current")
    if old == release:
        return old
    if old:
        _symlink_atomic(root / "releases" / old, root / "previous")
    _symlink_atomic(rel, root / "current")
    return old


def switch_step(args: dict) -> dict:
    """`switch` as a step: {"changed", "from", "current", "previous"}; with ``check``, what it would do."""
    root, release, _rel = release_dir(args)
    old = link_target(root / "current")
    if old != release and not flag(args, "check"):
        switch(root, release)
    return {"changed": old != release, "from": old, "current": release,
            "previous": old if old and old != release else link_target(root / "previous")}


def _symlink_atomic(target: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(str(target), tmp)
    os.replace(tmp, link)


def prune(args: dict) -> dict:
    """Keep the newest ``keep`` directories (by mtime) of `releases/` (``kind`` "releases", the default; a removed
    release's uploaded wheelhouse goes too) or `models/` ("models"), never one named in ``protect``, nor what
    `current` and `previous` use (their releases, and the models their env files name). ``check``: only say."""
    root = Path(args["root"])
    kind = args.get("kind", "releases")
    if kind not in ("releases", "models"):
        raise HostError(f"prune: kind {kind!r}: use releases or models")
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

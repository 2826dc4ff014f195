"""Run an ansible-playbook of ops/playbooks against an inventory and return what happened per host.

Progress streams to the terminal as Ansible prints it; the result comes from the `vlfleet_profile` callback's
JSON report (ops/ansible_plugins/callback), not from parsing text: per-host recap, the tasks that changed
something on each host, failures with their messages, and per-role/per-task wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.paths import repo_root

PLAYBOOKS = repo_root() / "ops" / "playbooks"


class PlaybookError(RuntimeError):
    """ansible-playbook could not be run at all (missing binary, playbook or inventory)."""


@dataclass
class PlaybookRun:
    """The outcome of one ansible-playbook run."""

    returncode: int
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    changed: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    roles: dict[str, float] = field(default_factory=dict)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def changed_count(self, host: str) -> int:
        return self.recap.get(host, {}).get("changed", 0)

    def summary(self) -> str:
        lines = [f"{host}: " + " ".join(f"{k}={v}" for k, v in counts.items() if k in
                                         ("ok", "changed", "failures", "unreachable", "skipped"))
                 for host, counts in self.recap.items()]
        for host, failures in self.failed.items():
            for f in failures:
                lines.append(f"{host}: FAILED {f['task']}: {f['msg']}")
        return "\n".join(lines)


def ansible_playbook_binary() -> str:
    # Prefer the one beside this interpreter (the project venv), so the pinned ansible-core runs.
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise PlaybookError("ansible-playbook not found: install the controller extra (pip install -e '.[controller]')")
    return found


def ansible_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment that makes any ansible-playbook run use the project's roles, callback and SSH settings."""
    root = repo_root()
    env = dict(os.environ if base is None else base)
    env.update({
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(root / "roles"),
        "ANSIBLE_CALLBACK_PLUGINS": str(root / "ops" / "ansible_plugins" / "callback"),
        "ANSIBLE_LOOKUP_PLUGINS": str(root / "ops" / "ansible_plugins" / "lookup"),
        "ANSIBLE_CALLBACKS_ENABLED": "vlfleet_profile",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def run_playbook(
    inventory: Path | str,
    playbook: Path | str = "site.yml",
    extra_vars: Mapping[str, Any] | None = None,
    *,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    tags: Sequence[str] = (),
    verbosity: int = 0,
    timeout: float = 3600,
    echo: Callable[[str], None] | None = print,
    env: Mapping[str, str] | None = None,
) -> PlaybookRun:
    """Run a playbook (a name under ops/playbooks or a path) and return its per-host outcome.

    :param echo: called with every output line as it arrives (None: quiet); the full text is in ``output``.
    :param timeout: seconds before the run is killed (it then returns with returncode -9).
    :param env: more environment for ansible-playbook, over the project's (e.g. ``{"ANSIBLE_FORKS": "17"}``).
    """
    path = Path(playbook)
    if not path.is_absolute() and not path.exists():
        path = PLAYBOOKS / path
    if not path.is_file():
        raise PlaybookError(f"playbook {path} does not exist")
    inventory = Path(inventory)
    if not inventory.exists():
        raise PlaybookError(f"inventory {inventory} does not exist: pass --inventory PATH "
                            f"(see inventory.example, or `vlfleet staging.up` for a local fleet)")
    with tempfile.TemporaryDirectory(prefix="vlfleet-play-") as tmp:
        report_path = Path(tmp) / "profile.json"
        cmd = [ansible_playbook_binary(), "-i", str(inventory), str(path)]
        if extra_vars:
            vars_path = Path(tmp) / "extra-vars.json"
            vars_path.write_text(json.dumps(dict(extra_vars)))
            cmd += ["-e", f"@{vars_path}"]
        if check:
            cmd.append("--check")
        if diff:
            cmd.append("--diff")
        if limit:
            cmd += ["--limit", limit]
        if tags:
            cmd += ["--tags", ",".join(tags)]
        if verbosity:
            cmd.append("-" + "v" * verbosity)
        run_env = {**ansible_env(), **(env or {}), "VLFLEET_PROFILE_JSON": str(report_path)}
        output: list[str] = []
        deadline = time.monotonic() + timeout
        proc = subprocess.Popen(cmd, env=run_env, cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.append(line)
                if echo is not None:
                    echo(line.rstrip("\n"))
                if time.monotonic() > deadline:
                    proc.kill()
                    output.append(f"vlfleet: ansible-playbook killed after {timeout:.0f} s\n")
                    break
            returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            returncode = proc.wait()
        run = PlaybookRun(returncode=returncode, output="".join(output))
        if report_path.exists():
            report = json.loads(report_path.read_text())
            run.recap = report.get("recap", {})
            run.changed = report.get("changed", {})
            run.failed = report.get("failed", {})
            run.roles = report.get("roles", {})
            run.tasks = report.get("tasks", [])
            run.duration = report.get("duration", 0.0)
        return run


def host_python_versions(inventory: Path | str, pattern: str = "vlm", timeout: float = 120) -> dict[str, str]:
    """Ask every host matching ``pattern`` for its python3 version ("3.10"), with an ad-hoc ansible call."""
    binary = ansible_playbook_binary().replace("ansible-playbook", "ansible")
    cmd = [binary, pattern, "-i", str(inventory), "-o", "-m", "ansible.builtin.command", "-a", "python3 --version"]
    try:
        done = subprocess.run(cmd, env=ansible_env(), cwd=repo_root(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise PlaybookError(f"asking the hosts for their Python version timed out after {timeout:.0f} s") from e
    versions: dict[str, str] = {}
    for line in done.stdout.splitlines():
        # "host | CHANGED | rc=0 | (stdout) Python 3.11.2"
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 4 and parts[3].startswith("(stdout) Python 3."):
            versions[parts[0]] = ".".join(parts[3].split()[2].split(".")[:2])
    if done.returncode != 0 or not versions:
        raise PlaybookError(f"could not read the Python version of the {pattern} hosts:\n{done.stdout}{done.stderr}")
    return versions

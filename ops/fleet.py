"""Fleet operations over SSH with Fabric: rollout of a release, rollback, rolling restart, status.

The controller side of each step lives here; the host side is ops/host_agent.py, whose source travels with every
call (`sudo python3 -c ...`), so a host needs only its distribution's python3. One host's change, in order:

  stage the release beside the running one (venv, env file, model)  -- nothing serving changes yet
  drain it in nginx on every lb host (marked `down`, reload)          -- no new requests reach it
  wait until its in-flight requests finish (bounded by --drain-timeout)
  switch `current`, restart the unit, wait for /readyz naming the release and a real smoke answer
  put it back in nginx; on a failed gate: switch back to the previous release, gate again, put it back

Batching, parallelism and the --max-fail stop are ops/rollout.py's.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shlex
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import host_agent
from ops.paths import repo_root
from ops.rollout import HostResult, Outcome, Report, describe_error, format_table, run_batches

AGENT_SOURCE = Path(host_agent.__file__).read_text()


class FleetError(RuntimeError):
    """The fleet cannot be worked on as asked (inventory, arguments); the message says what to change."""


class StepError(RuntimeError):
    """A host step reported a failure (the host agent's error, or a bad answer)."""


# ---------------------------------------------------------------------------------------------------------------
# Inventory


@dataclass
class Host:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    def var(self, key: str, default: Any = None) -> Any:
        value = self.vars.get(key, default)
        # Values still holding Jinja (e.g. "{{ ansible_host }}") mean something only to Ansible: use the default.
        return default if isinstance(value, str) and "{{" in value else value

    @property
    def address(self) -> str:
        return str(self.var("ansible_host", self.name))

    @property
    def root(self) -> str:
        return str(self.var("vlfleet_root", "/opt/vlfleet"))

    @property
    def unit(self) -> str:
        return str(self.var("vlm_service_name", "vlfleet"))

    @property
    def python(self) -> str:
        value = str(self.var("ansible_python_interpreter", "/usr/bin/python3"))
        return value if value.startswith("/") else "/usr/bin/python3"


@dataclass
class Inventory:
    hosts: dict[str, Host]

    def group(self, name: str) -> list[Host]:
        return [h for h in self.hosts.values() if name in h.groups]


def load_inventory(path: Path | str) -> Inventory:
    """Read any Ansible inventory (YAML, INI, with group_vars) the way Ansible does: `ansible-inventory --list`."""
    from ops.playbook import PlaybookError, ansible_env, ansible_playbook_binary

    path = Path(path).expanduser().resolve()  # ansible-inventory runs from the repo root
    if not path.exists():
        raise FleetError(f"inventory {path} not found: pass --inventory PATH (see inventory.example, or the one "
                         f"`vlfleet staging.up` prints)")
    try:
        binary = ansible_playbook_binary().replace("ansible-playbook", "ansible-inventory")
    except PlaybookError as e:
        raise FleetError(str(e)) from e
    done = subprocess.run([binary, "-i", str(path), "--list"], env=ansible_env(), cwd=repo_root(),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise FleetError(f"ansible-inventory could not read {path}: {done.stderr.strip()[-400:]}")
    return parse_inventory_json(json.loads(done.stdout))


def parse_inventory_json(data: Mapping[str, Any]) -> Inventory:
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    hosts: dict[str, Host] = {}

    def walk(group: str, seen: tuple[str, ...] = ()) -> list[str]:
        body = data.get(group) or {}
        members = list(body.get("hosts") or [])
        for child in body.get("children") or []:
            if child not in seen:
                members += walk(child, (*seen, group))
        return members

    for group in data:
        if group == "_meta":
            continue
        for name in walk(group):
            hosts.setdefault(name, Host(name, dict(hostvars.get(name) or {})))
            if group not in hosts[name].groups:
                hosts[name].groups.append(group)
    # Keep the inventory's host order (the canary is the first vlm host), which `--list` gives per group.
    return Inventory(hosts)


# ---------------------------------------------------------------------------------------------------------------
# Talking to hosts


def _agent_command(python: str, command: str, args: Mapping[str, Any], lock: str | None = None) -> str:
    code = base64.b64encode(zlib.compress(AGENT_SOURCE.encode(), 9)).decode()
    boot = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{code}')))"
    payload = base64.b64encode(json.dumps(dict(args)).encode()).decode()
    prefix = f"sudo -n flock {shlex.quote(lock)} " if lock else "sudo -n "
    return f"{prefix}{python} -c {shlex.quote(boot)} {command} {payload}"


def agent_command_name(cmd: str) -> str:
    """The host agent subcommand a command line runs (for tests and logs)."""
    return cmd.split()[-2]


def agent_args(cmd: str) -> dict:
    return json.loads(base64.b64decode(cmd.split()[-1]))


def parse_agent_output(stdout: str, stderr: str, exited: int) -> dict:
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
        if isinstance(result, dict):
            if "error" in result:
                raise StepError(result["error"])
            if exited == 0:
                return result
    tail = (stderr or stdout).strip().splitlines()[-3:]
    if exited != 0 and any("sudo" in line and "password" in line for line in tail):
        raise StepError("sudo asks for a password: the SSH user needs passwordless sudo on the host")
    raise StepError(f"host agent failed (exit {exited}): {' | '.join(tail)[:400] or 'no output'}")


@dataclass
class Timeouts:
    connect: int = 15
    drain: float = 60.0  # in-flight requests get this long to finish once the host is out of nginx
    ready: float = 600.0  # model load + warm-up + smoke answer after a restart
    command: float = 300.0  # any other remote step


class Fleet:
    """Connections to the hosts of an inventory, and the steps that change one host."""

    def __init__(self, inventory: Inventory, *, group: str = "vlm", lb_group: str = "lb",
                 limit: Iterable[str] | None = None, timeouts: Timeouts | None = None,
                 echo: Callable[[str], None] | None = print) -> None:
        from fabric import Connection

        self.inventory = inventory
        self.timeouts = timeouts or Timeouts()
        self.echo = echo or (lambda _line: None)
        members = inventory.group(group)
        if not members:
            raise FleetError(f"the inventory has no hosts in group {group!r}")
        if limit:
            wanted = list(limit)
            unknown = [h for h in wanted if h not in {m.name for m in members}]
            if unknown:
                raise FleetError(f"host {', '.join(unknown)} is not in group {group!r} of the inventory "
                                 f"(it has {', '.join(m.name for m in members)})")
            members = [m for m in members if m.name in wanted]
        self.hosts: list[Host] = members
        self.lbs: list[Host] = inventory.group(lb_group)
        self._lb_lock = threading.Lock()
        # Connections are made up front, in inventory order: a host's connection is used by one thread at a time.
        self.conns = {h.name: self._connect(Connection, h) for h in self.hosts + self.lbs}

    def _connect(self, connection_class, host: Host):
        kwargs: dict[str, Any] = {"banner_timeout": self.timeouts.connect, "auth_timeout": self.timeouts.connect}
        key = host.var("ansible_ssh_private_key_file") or host.var("ansible_private_key_file")
        if key:
            kwargs["key_filename"] = str(Path(str(key)).expanduser())
        port = host.var("ansible_port") or host.var("ansible_ssh_port")
        return connection_class(host.address, user=host.var("ansible_user"), port=int(port) if port else None,
                                connect_timeout=self.timeouts.connect, connect_kwargs=kwargs)

    def close(self) -> None:
        for c in self.conns.values():
            # closing a dead connection must not hide the report
            with contextlib.suppress(Exception):
                c.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def host(self, name: str) -> Host:
        return self.inventory.hosts[name]

    def agent(self, name: str, command: str, args: Mapping[str, Any], timeout: float | None = None,
              lock: str | None = None) -> dict:
        host = self.host(name)
        cmd = _agent_command(host.python, command, args, lock)
        res = self.conns[name].run(cmd, hide=True, warn=True, in_stream=False,
                                   timeout=timeout or self.timeouts.command)
        return parse_agent_output(res.stdout, res.stderr, res.exited)

    # -- load balancer -------------------------------------------------------------------------------------------

    def set_drained(self, drain: list[str], undrain: list[str]) -> None:
        """Mark hosts drained / back in rotation on every lb host (serialized: one nginx site per lb)."""
        if not self.lbs:
            return
        with self._lb_lock:
            for lb in self.lbs:
                site = f"/etc/nginx/sites-available/{lb.var('lb_site_name', 'vlfleet')}"
                self.agent(lb.name, "lb", {"site": site, "drain": drain, "undrain": undrain},
                           lock="/run/lock/vlfleet-lb.lock")

    # -- one host ------------------------------------------------------------------------------------------------

    def describe(self, name: str) -> dict:
        return self.agent(name, "describe", {"root": self.host(name).root})

    def probe(self, name: str) -> dict:
        h = self.host(name)
        return self.agent(name, "probe", {"root": h.root, "unit": h.unit}, timeout=60)

    def activate(self, name: str, release: str | None) -> dict:
        h = self.host(name)
        return self.agent(name, "activate", {"root": h.root, "unit": h.unit, "release": release,
                                             "timeout": self.timeouts.ready},
                          timeout=self.timeouts.ready + 180)

    def swap_in(self, name: str, release: str | None, before: str | None) -> HostResult:
        """Drain, wait for in-flight requests, activate ``release`` (None: restart), gate, undrain; on a failed
        gate go back to ``before`` (when given). Exceptions leave the host drained and become its result."""
        drained = False
        try:
            self.set_drained([name], [])
            drained = True
            h = self.host(name)
            q = self.agent(name, "quiesce", {"root": h.root, "timeout": self.timeouts.drain},
                           timeout=self.timeouts.drain + 60)
            note = f"drained ({q['waited_s']:.0f}s" + (f", {q['left']} request(s) cut off)" if q["left"] else ")")
            res = self.activate(name, release)
            if res["ok"]:
                self.set_drained([], [name])
                smoke = res.get("smoke") or {}
                return HostResult(name, Outcome.OK, release=res["release"], before=before or res.get("from"),
                                  message=f"{note}; ready in {res['ready_s']:.0f}s; smoke {smoke.get('tokens')} "
                                          f"tokens in {smoke.get('seconds')}s")
            why = res["reason"] + _journal_hint(res.get("journal"))
            if not before:  # a restart has nothing to go back to
                return HostResult(name, Outcome.FAILED, release=res.get("release"), before=before,
                                  message=f"{why}; left out of nginx")
            back = self.activate(name, before)
            if back["ok"]:
                self.set_drained([], [name])
                return HostResult(name, Outcome.ROLLED_BACK, release=back["release"], before=before,
                                  message=f"{why}; back on {before}")
            return HostResult(name, Outcome.FAILED, release=back.get("release"), before=before,
                              message=f"{why}; rollback to {before} failed too: {back['reason']}; left out of nginx")
        except Exception as e:  # reported per host
            outcome, message = (Outcome.FAILED, str(e)) if isinstance(e, StepError) else describe_error(e)
            if drained:
                message += "; left out of nginx (drained) until someone looks"
            return HostResult(name, outcome, before=before, message=message)


def _journal_hint(journal: list[str] | None) -> str:
    """The journal line most likely to say why: the service's own last words, not systemd's bookkeeping."""
    lines = [line for line in (journal or []) if line.strip()]
    own = [line for line in lines if not _SYSTEMD_LINE.match(line)]
    pick = (own or lines)[-1:]
    return f" [journal: {pick[0][:240]}]" if pick else ""


_SYSTEMD_LINE = re.compile(r"^(\S+\.service: |Started |Starting |Stopped |Stopping |Scheduled restart|Consumed )")


# ---------------------------------------------------------------------------------------------------------------
# Releases


@dataclass
class Release:
    """What to roll out: a release id, and what differs from the release each host runs now."""

    id: str
    wheelhouse: Path | None = None  # new code/pins: a wheelhouse dir (None: reuse the current release's venv)
    artifact: Path | None = None  # new model: an artifact dir with manifest.json (None: keep the current model)
    env: dict[str, str] = field(default_factory=dict)  # VLFLEET_* changes; an empty value removes the variable

    def __post_init__(self) -> None:
        try:
            host_agent.check_id(self.id)
        except host_agent.AgentError as e:
            raise FleetError(f"--release: {e}") from None
        if self.wheelhouse is not None and not (self.wheelhouse / "requirements.txt").is_file():
            raise FleetError(f"--wheelhouse {self.wheelhouse}: no requirements.txt there; build one with "
                             f"`vlfleet wheelhouse.build --python X.Y --out DIR`")
        if self.artifact is not None and not (self.artifact / "manifest.json").is_file():
            raise FleetError(f"--artifact {self.artifact}: no manifest.json there; build one with "
                             f"`vlfleet model.build`")
        bad = [k for k in self.env if not k.startswith("VLFLEET_")]
        if bad:
            raise FleetError(f"--env: only VLFLEET_* settings belong in a release's env file, not {', '.join(bad)}")

    @property
    def wheelhouse_sha(self) -> str | None:
        if self.wheelhouse is None:
            return None
        return hashlib.sha256((self.wheelhouse / "requirements.txt").read_bytes()).hexdigest()

    @property
    def artifact_id(self) -> str | None:
        if self.artifact is None:
            return None
        return json.loads((self.artifact / "manifest.json").read_text())["artifact_id"]


def parse_env(pairs: str | None) -> dict[str, str]:
    """"K=V,K2=V2" -> dict (a value may not contain commas; repeat --env for such values)."""
    env: dict[str, str] = {}
    for pair in (p for p in (pairs or "").split(",") if p.strip()):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FleetError(f"--env: {pair!r} is not KEY=VALUE")
        env[key.strip()] = value.strip()
    return env


def render_env(environment: Mapping[str, str]) -> str:
    """The release's env file, from the same template the vlm_service role renders."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(repo_root() / "templates"), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.get_template("vlfleet.env.j2").render(vlm_service_environment=dict(environment))


def release_env(current: Mapping[str, str], release: Release, root: str) -> dict[str, str]:
    env = dict(current)
    env["VLFLEET_RELEASE_ID"] = release.id
    if release.artifact_id:
        env["VLFLEET_MODEL_DIR"] = f"{root}/models/{release.artifact_id}"
    for key, value in release.env.items():
        if value == "":
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _upload_dir(conn, local: Path, remote: str) -> None:
    """Copy a directory tree to ``remote`` (a fresh path the SSH user may write) over SFTP."""
    conn.run(f"rm -rf {shlex.quote(remote)} && mkdir -p {shlex.quote(remote)}", hide=True, in_stream=False)
    sftp = conn.sftp()
    for path in sorted(local.rglob("*")):
        target = f"{remote}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            sftp.mkdir(target)
        elif path.is_file():
            sftp.put(str(path), target)


def stage_release(fleet: Fleet, name: str, release: Release, info: Mapping[str, Any]) -> str:
    """Put ``release`` on the host beside the running one; returns what was done."""
    h = fleet.host(name)
    conn = fleet.conns[name]
    args: dict[str, Any] = {"root": h.root, "release": release.id, "python": h.python,
                            "group": h.var("vlm_service_group", "vlfleet"),
                            "env_text": render_env(release_env(info["env"], release, h.root))}
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
            upload = f"/tmp/vlfleet-upload-{sha[:12]}"  # a fresh dir of the SSH user, moved by root
            _upload_dir(conn, release.wheelhouse, upload)  # type: ignore[arg-type]
            dest = f"{h.root}/wheelhouses/{release.id}"
            fleet.agent(name, "place", {"src": upload, "dest": dest})
            args["wheelhouse"] = dest
    done = fleet.agent(name, "stage", args, timeout=1900)
    what = f"venv {done['venv']}"
    if release.artifact_id and release.artifact_id not in info["models"]:
        upload = f"/tmp/vlfleet-upload-{release.artifact_id[:40]}"  # as above
        _upload_dir(conn, release.artifact, upload)  # type: ignore[arg-type]
        fleet.agent(name, "place", {"src": upload, "dest": f"{h.root}/models/{release.artifact_id}",
                                    "verify_with": f"{h.root}/releases/{release.id}/venv/bin/python"},
                    timeout=1900)
        what += f", model {release.artifact_id} copied and verified"
    return what


# ---------------------------------------------------------------------------------------------------------------
# Fleet-wide actions


def rollout(fleet: Fleet, release: Release, *, batch: str = "1,25%,50%", max_fail: str | int = 0,
            parallel: int = 4, keep: int = 3) -> Report:
    def step(name: str) -> HostResult:
        try:
            info = fleet.describe(name)
            if not info.get("current"):
                raise StepError("no current release on the host: converge it with `vlfleet site` first")
            before = info["current"]
            if before == release.id:
                probe = fleet.probe(name)
                if probe.get("readyz_status") == 200:
                    return HostResult(name, Outcome.UNCHANGED, release=before, before=before,
                                      message="already on it and ready")
            staged = stage_release(fleet, name, release, info)
        except Exception as e:  # nothing serving was touched yet: say so
            outcome, message = (Outcome.FAILED, str(e)) if isinstance(e, StepError) else describe_error(e)
            return HostResult(name, outcome, message=f"{message} (before any change; still serving)")
        result = fleet.swap_in(name, release.id, before if before != release.id else None)
        result.message = f"{staged}; {result.message}"
        if result.outcome is Outcome.OK:
            try:
                pruned = fleet.agent(name, "prune", {"root": fleet.host(name).root, "keep": keep})
                if pruned["removed"]:
                    result.message += f"; pruned {', '.join(pruned['removed'])}"
            except Exception as e:  # pruning is housekeeping; the host is fine
                result.message += f"; prune failed: {e}"
        return result

    return run_batches("rollout", release.id, [h.name for h in fleet.hosts], step, batch=batch,
                       max_fail=max_fail, parallel=parallel, echo=fleet.echo)


def rollback(fleet: Fleet, to: str | None = None, *, batch: str = "1,25%,50%", max_fail: str | int = 0,
             parallel: int = 4) -> Report:
    def step(name: str) -> HostResult:
        try:
            info = fleet.describe(name)
            target = to or info.get("previous")
            if not target:
                raise StepError("no previous release recorded on the host: pass --to RELEASE")
            have = {r["id"] for r in info["releases"] if r["complete"]}
            if target not in have:
                raise StepError(f"release {target} is not on the host (it has {', '.join(sorted(have)) or 'none'})")
        except Exception as e:
            outcome, message = (Outcome.FAILED, str(e)) if isinstance(e, StepError) else describe_error(e)
            return HostResult(name, outcome, message=f"{message} (nothing changed)")
        if info["current"] == target:
            return HostResult(name, Outcome.UNCHANGED, release=target, before=target, message="already on it")
        return fleet.swap_in(name, target, info["current"])

    return run_batches("rollback", to or "previous release", [h.name for h in fleet.hosts], step, batch=batch,
                       max_fail=max_fail, parallel=parallel, echo=fleet.echo)


def restart(fleet: Fleet, *, batch: str = "1", max_fail: str | int = 0, parallel: int = 4) -> Report:
    def step(name: str) -> HostResult:
        return fleet.swap_in(name, None, None)

    return run_batches("restart", "current release", [h.name for h in fleet.hosts], step, batch=batch,
                       max_fail=max_fail, parallel=parallel, echo=fleet.echo)


def status(fleet: Fleet, parallel: int = 8) -> list[dict]:
    """One row per host: release, artifact, ready, queue depth, uptime, RSS, first-token p50."""
    from concurrent.futures import ThreadPoolExecutor

    from ops.prometheus_text import histogram_quantile, info_labels

    def one(host: Host) -> dict:
        row: dict[str, Any] = {"host": host.name}
        try:
            p = fleet.probe(host.name)
        except Exception as e:  # shown in the table
            row["error"] = str(e) if isinstance(e, StepError) else describe_error(e)[1]
            return row
        ready = p.get("readyz") or {}
        labels = info_labels(p.get("metrics", ""), "vlfleet_model_info")
        row.update({
            "release": p.get("release"),
            "serving": ready.get("release_id") or labels.get("release_id"),
            "artifact": ready.get("artifact_id") or labels.get("artifact_id"),
            "ready": p.get("readyz_status") == 200,
            "unit": "/".join(str(p["unit"].get(k)) for k in ("ActiveState", "SubState")),
            "queue_depth": ready.get("queue_depth"),
            "uptime_s": ready.get("uptime_s"),
            "rss_bytes": p.get("rss_bytes"),
            "ttft_p50_s": histogram_quantile(p.get("metrics", ""), "vlfleet_time_to_first_token_seconds", 0.5),
            "reason": ready.get("reason", ""),
        })
        return row

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, fleet.hosts))


def status_table(rows: list[dict]) -> str:
    table = [("host", "release", "artifact", "ready", "queue", "uptime", "rss", "ttft p50", "notes")]
    for r in rows:
        if "error" in r:
            table.append((r["host"], "?", "?", "unreachable", "-", "-", "-", "-", r["error"]))
            continue
        notes = r["reason"]
        if r["serving"] and r["release"] and r["serving"] != r["release"]:
            notes = f"current -> {r['release']} but the process serves {r['serving']} (restart pending)"
        if not r["ready"]:
            notes = f"{r['unit']} {notes}".strip()
        table.append((
            r["host"], r["release"] or "-", (r["artifact"] or "-")[:40], "yes" if r["ready"] else "no",
            "-" if r["queue_depth"] is None else str(r["queue_depth"]),
            "-" if r["uptime_s"] is None else _duration(r["uptime_s"]),
            "-" if not r["rss_bytes"] else f"{r['rss_bytes'] / 2**20:.0f} MiB",
            "-" if r["ttft_p50_s"] is None else f"{r['ttft_p50_s']:.2f}s", notes))
    return format_table(table)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"

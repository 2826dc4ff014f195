"""Talking to the live fleet's hosts over SSH with Fabric: one connection per host, the host program's command line
(ops/host/, put on each host once per version by ops/fleet/host_program.py: `sudo python3 <program> STEP ARGS`, so a
host needs only its distribution's python3) and its answer, and the lb step that drains a host in nginx."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shlex
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.fleet.host_program import StepError, build, ensure
from ops.fleet.inventory import FleetError, Host, Inventory
from service.runtime.contract import TUNED_FILE


def step_command(python: str, program: str, step: str, args: Mapping[str, Any], lock: str | None = None) -> str:
    """``sudo -n [flock LOCK] PYTHON PROGRAM STEP BASE64-JSON``: one step of the host program at ``program``."""
    payload = base64.b64encode(json.dumps(dict(args)).encode()).decode()
    prefix = f"sudo -n flock {shlex.quote(lock)} " if lock else "sudo -n "
    return f"{prefix}{python} {shlex.quote(program)} {step} {payload}"


def step_name(cmd: str) -> str:
    """The host program step a command line runs (for tests and logs)."""
    return cmd.split()[-2]


def step_args(cmd: str) -> dict:
    return json.loads(base64.b64decode(cmd.split()[-1]))


def parse_step_output(stdout: str, stderr: str, exited: int) -> dict:
    answers = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    try:
        result = json.loads(answers[-1])
    except (IndexError, ValueError):
        result = None
    if isinstance(result, dict) and "error" in result:
        raise StepError(result["error"])
    if isinstance(result, dict) and exited == 0:
        return result
    tail = (stderr or stdout).strip().splitlines()[-3:]
    if exited != 0 and any("sudo" in line and "password" in line for line in tail):
        raise StepError("sudo asks for a password: the SSH user needs passwordless sudo on the host")
    raise StepError(f"host program failed (exit {exited}): {' | '.join(tail)[:400] or 'no output'}")


@dataclass
class Timeouts:
    connect: int = 15
    drain: float = 60.0  # in-flight requests get this long to finish once the host is out of nginx
    ready: float = 600.0  # model load + warm-up + smoke answer after a restart
    command: float = 300.0  # any other remote step


class Fleet(contextlib.AbstractContextManager):
    """Connections to the hosts of an inventory, and the host program's steps and probes on them."""

    def __init__(self, inventory: Inventory, *, limit: Collection[str] | None = None, timeouts: Timeouts | None = None,
                 echo: Callable[[str], None] | None = print, ship: bool = True) -> None:
        self.inventory = inventory
        self.timeouts = timeouts or Timeouts()
        self.echo = echo or (lambda _line: None)
        members = inventory.group("vlm")
        if not members:
            raise FleetError("the inventory has no hosts in group 'vlm'")
        if limit:
            unknown = [h for h in limit if h not in {m.name for m in members}]
            if unknown:
                raise FleetError(f"host {', '.join(unknown)} is not in group 'vlm' of the inventory "
                                 f"(it has {', '.join(m.name for m in members)})")
            members = [m for m in members if m.name in limit]
        self.hosts: list[Host] = members
        self.lbs: list[Host] = inventory.group("lb")
        self._lb_lock = threading.Lock()
        self.program = build()
        self._shipped: dict[str, str] = {} if ship else dict.fromkeys(inventory.hosts, self.program.remote)
        # Connections are made up front, in inventory order: a host's connection is used by one thread at a time.
        self.conns = {h.name: self._connect(h) for h in self.hosts + self.lbs}

    def _connect(self, host: Host):
        from fabric import Connection

        kwargs: dict[str, Any] = {"banner_timeout": self.timeouts.connect, "auth_timeout": self.timeouts.connect}
        key = host.var("ansible_ssh_private_key_file") or host.var("ansible_private_key_file")
        if key:
            kwargs["key_filename"] = str(Path(str(key)).expanduser())
        port = host.var("ansible_port") or host.var("ansible_ssh_port")
        return Connection(host.address, user=host.var("ansible_user"), port=int(port) if port else None,
                          connect_timeout=self.timeouts.connect, connect_kwargs=kwargs)

    def __exit__(self, *exc) -> None:
        for c in self.conns.values():
            # closing a dead connection must not hide the report
            with contextlib.suppress(Exception):
                c.close()

    def host(self, name: str) -> Host:
        return self.inventory.hosts[name]

    def program_on(self, name: str) -> str:
        """The host program's path on host ``name``, put there first unless it is there already (one host's
        connection is used by one thread at a time, so is its entry here)."""
        if name not in self._shipped:
            self._shipped[name] = ensure(self.conns[name], self.program)
        return self._shipped[name]

    def step(self, name: str, step: str, args: Mapping[str, Any], timeout: float | None = None,
             lock: str | None = None) -> dict:
        """Run host program step ``step`` on host ``name`` (as root); its answer, or StepError."""
        cmd = step_command(self.host(name).python, self.program_on(name), step, args, lock)
        res = self.conns[name].run(cmd, hide=True, warn=True, in_stream=False, timeout=timeout or self.timeouts.command)
        return parse_step_output(res.stdout, res.stderr, res.exited)

    def service_step(self, name: str, step: str, args: Mapping[str, Any], timeout: float | None = None) -> dict:
        """A step about the host's service: it names the release root and the systemd unit."""
        h = self.host(name)
        return self.step(name, step, {"root": h.root, "unit": h.unit, **args}, timeout=timeout)

    def restart_step(self, name: str, step: str, args: Mapping[str, Any]) -> dict:
        """A service step that restarts the unit and waits until it is ready, within the ready timeout (SSH gives it
        three minutes more: the host's own bound should be the one that says why)."""
        ready = self.timeouts.ready
        return self.service_step(name, step, {**args, "timeout": ready}, timeout=ready + 180)

    def probe(self, name: str, command: str, *args: object, python: str | None = None, timeout: float = 120.0) -> Any:
        """Run the host program's probe ``command`` on host ``name`` as root with ``python`` (default: the host's
        python3); its JSON answer, or StepError."""
        argv = [python or self.host(name).python, self.program_on(name), command, *(str(a) for a in args)]
        done = self.conns[name].run(shlex.join(["sudo", "-n", *argv]), hide=True, warn=True, in_stream=False,
                                    timeout=timeout)
        try:
            return json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise StepError(f"the {command} probe failed (exit {done.exited}): "
                            f"{(done.stderr or done.stdout).strip()[-300:]}") from None

    def latency(self, name: str, *args: object, timeout: float) -> list[dict]:
        """The latency probe (it asks the service, so it runs with the release venv's python): its timed answers,
        or one row with the error."""
        try:
            return self.probe(name, "latency", *args, python=f"{self.host(name).root}/current/venv/bin/python",
                              timeout=timeout)
        except StepError as e:
            return [{"error": str(e)}]

    def set_drained(self, drain: list[str], undrain: list[str]) -> None:
        """Mark hosts drained / back in rotation on every lb host (serialized: one nginx site per lb). A host the
        lb's ``lb_drained_hosts`` keeps drained (the operator's switch, which the lb role renders) stays drained."""
        with self._lb_lock:
            for lb in self.lbs:
                site = f"/etc/nginx/sites-available/{lb.var('lb_site_name', 'vlfleet')}"
                kept = set(lb.var("lb_drained_hosts") or ())
                self.step(lb.name, "lb", {"site": site, "drain": drain,
                                          "undrain": [h for h in undrain if h not in kept]},
                          lock="/run/lock/vlfleet-lb.lock")

    def describe(self, name: str) -> dict:
        return self.step(name, "describe", {"root": self.host(name).root})

    def status(self, name: str) -> dict:
        return self.service_step(name, "status", {"record": TUNED_FILE}, timeout=60)


def journal_hint(journal: list[str] | None) -> str:
    """The journal line most likely to say why: the service's own last words, not systemd's bookkeeping."""
    lines = [line for line in (journal or []) if line.strip()]
    own = [line for line in lines if not _SYSTEMD_LINE.match(line)]
    pick = (own or lines)[-1:]
    return f" [journal: {pick[0][:240]}]" if pick else ""


_SYSTEMD_LINE = re.compile(r"^(\S+\.service: |Started |Starting |Stopped |Stopping |Scheduled restart|Consumed )")

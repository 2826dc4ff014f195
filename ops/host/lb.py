"""The lb host: nginx upstream servers marked `down` (drained) or not, in the site the lb role rendered."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from .errors import HostError
from .system import run, write_atomic


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
    if missing := sorted(wanted - seen):
        raise HostError(f"the nginx site has no upstream server for {', '.join(missing)}: converge the lb with "
                         f"site.yml so it lists every vlm host")
    return "\n".join(lines), drained


def lb(args: dict) -> dict:
    site = Path(args["site"])
    try:
        old = site.read_text()
    except OSError as e:
        raise HostError(f"cannot read the nginx site {site}: {e}; converge the lb host with site.yml") from e
    new, drained = set_drained(old, list(args.get("drain", [])), list(args.get("undrain", [])))
    if new == old:
        return {"changed": False, "drained": drained}
    write_atomic(site, new.encode(), 0o644)
    test = subprocess.run([args.get("nginx", "/usr/sbin/nginx"), "-t", "-q"], capture_output=True, text=True,
                          timeout=60)
    if test.returncode != 0:
        write_atomic(site, old.encode(), 0o644)
        raise HostError(f"nginx -t rejected the edited site (restored): {test.stderr.strip()[-400:]}")
    # reload, never restart: old workers finish their open streams, new ones skip the drained servers
    workers = nginx_workers()
    run(["systemctl", "reload", "nginx.service"], timeout=60)
    wait_workers_replaced(workers)
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

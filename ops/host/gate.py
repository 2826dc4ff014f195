"""The service after a change: restart, the start gate (readiness naming the release, then a smoke answer), and the
drain wait (requests in flight)."""

from __future__ import annotations

import time
from pathlib import Path

from . import client, png
from .errors import HostError, flag
from .layout import link_target, read_env, service_address
from .release import switch
from .system import journal_tail, restart_unit, unit_state

SMOKE_TOKENS = 4
SMOKE_IMAGE = png.solid(64, 64, (128, 128, 128))  # the smoke request goes through the vision path as a user's would


def readyz(addr: tuple[str, int]) -> tuple[int, dict]:
    """/readyz of the service at ``addr``: (status, body); (0, {"reason": ...}) when it did not answer."""
    got = client.readyz(client.base_url(*addr) + "/readyz", timeout=5)
    body = got["body"] if isinstance(got["body"], dict) else {"reason": got["error"] or str(got["body"])[:300]}
    return got["status"] or 0, body


def smoke(addr: tuple[str, int], timeout: float, key: str | None = None) -> dict:
    """A real answer: one image and a question, a fixed number of tokens (the model's words may be noise)."""
    # a nonce: the service replays identical deterministic requests from its answer cache
    question = client.user_turn(client.data_url(SMOKE_IMAGE), f"What is in this picture? ({time.time():.6f})")
    body = {"messages": [question], "max_tokens": SMOKE_TOKENS, "ignore_eos": True, "stream": False}
    answer = client.chat(client.base_url(*addr), body, timeout=timeout, key=key)
    seconds = round(answer.total_s or 0.0, 2)
    if answer.status is None:
        return {"ok": False, "reason": f"smoke request failed: {answer.error}"}
    if answer.error or answer.tokens != SMOKE_TOKENS:
        return {"ok": False, "reason": f"smoke answer: HTTP {answer.status}, {answer.tokens} tokens (want "
                                       f"{SMOKE_TOKENS}): {answer.error or answer.text[:300]}", "seconds": seconds}
    return {"ok": True, "tokens": answer.tokens, "seconds": seconds}


def wait_ready(addr: tuple[str, int], unit: str, accept, timeout: float, since: float | None, restarts: int,
               poll: float = 1.0) -> dict:
    """Wait (bounded) for /readyz 200 with a body ``accept`` takes; fail fast when the unit crashes meanwhile or
    the engine reports that it gave up (its model failed to load, its llama-server died while loading).
    {"ok": True, "ready_s", "readyz"} or {"ok": False, "reason", "journal"}."""
    def gone() -> str | None:
        state = unit_state(unit)
        if (state.get("ActiveState") in ("failed", "inactive") or state.get("SubState") == "auto-restart"
                or int(state.get("NRestarts") or 0) > restarts):
            return (f"the service exited ({state.get('ActiveState')}/{state.get('SubState')}, exit status "
                    f"{state.get('ExecMainStatus')})")
        return None

    try:
        seconds, body = client.wait_ready(client.base_url(*addr), timeout, poll, alive=gone, accept=accept)
    except client.NotReady as e:
        return {"ok": False, "reason": str(e), "journal": journal_tail(unit, since)}
    return {"ok": True, "ready_s": round(seconds, 1), "readyz": body}


def gate(root: Path, unit: str, release: str | None, timeout: float, since: float | None, restarts: int,
         smoke_answer: bool = True) -> dict:
    """Wait (bounded) for /readyz 200 naming ``release``, then a smoke answer; fail fast when the unit crashes."""
    env = read_env(root / "current" / "vlfleet.env")
    addr = service_address(env)
    deadline = time.monotonic() + timeout
    ready = wait_ready(addr, unit, lambda body: release is None or body.get("release_id") == release, timeout, since,
                       restarts)
    if not ready["ok"] or not smoke_answer:
        return ready
    result = smoke(addr, timeout=max(30.0, deadline - time.monotonic()), key=client.api_key(env))
    if not result["ok"]:
        return {"ok": False, "reason": result["reason"], "journal": journal_tail(unit, since),
                "readyz": ready["readyz"]}
    return {"ok": True, "ready_s": ready["ready_s"], "smoke": result, "readyz": ready["readyz"]}


def activate(args: dict) -> dict:
    """Switch `current` (when a release is given), restart the unit, then gate it."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    release = args.get("release")
    old = switch(root, release) if release else link_target(root / "current")
    since, restarts = restart_unit(unit, float(args.get("stop_timeout", 120)))
    result = gate(root, unit, release or link_target(root / "current"), float(args.get("timeout", 600)), since,
                  restarts)
    return {**result, "release": link_target(root / "current"), "from": old}


def gate_step(args: dict) -> dict:
    """The start gate after the roles' restart (or none): /readyz 200 naming ``release`` within ``timeout``, then a
    smoke answer; an error with the reason and the unit's last journal lines otherwise. With ``check`` (the switch
    was only previewed): readiness of whatever runs, no smoke request."""
    root = Path(args["root"])
    unit = args.get("unit", "vlfleet")
    check = flag(args, "check")
    timeout = float(args.get("timeout", 600))
    restarts = int(unit_state(unit).get("NRestarts") or 0)
    result = gate(root, unit, None if check else args.get("release"), timeout, None, restarts, smoke_answer=not check)
    if not result["ok"]:
        journal = "\n".join(result.get("journal") or journal_tail(unit, lines=40))
        raise HostError(f"{unit} did not pass its start gate within {timeout:.0f} s: {result['reason']}\n"
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
            local, remote, state = line.split()[1:4]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and not _is_loopback_hex(remote):
                count += 1
    return count


def _is_loopback_hex(addr_port: str) -> bool:
    addr = addr_port.rsplit(":", 1)[0]
    if len(addr) == 8:  # IPv4, little-endian: 127.x.x.x has 7F as its last byte
        return addr[6:8] == "7F"
    # IPv6 ::1, or an IPv4-mapped ::ffff:127.x.x.x
    return addr == "00000000000000000000000001000000" or (addr[:24] == "0000000000000000FFFF0000" and addr[30:] == "7F")


def quiesce(args: dict) -> dict:
    """After the lb stopped sending new requests: wait (bounded) until the requests in flight have finished."""
    addr = service_address(read_env(Path(args["root"]) / "current" / "vlfleet.env"))
    timeout = float(args.get("timeout", 60))
    started = time.monotonic()
    left = -1
    while time.monotonic() - started < timeout:
        # in flight: the lb's open connections, or the service's queue when it counts more
        left = max(established_clients(addr[1]), int(readyz(addr)[1].get("queue_depth") or 0))
        if left == 0:
            break
        time.sleep(0.5)
    return {"left": left, "waited_s": round(time.monotonic() - started, 1)}

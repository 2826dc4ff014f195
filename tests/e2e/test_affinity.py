"""A conversation keeps its host through the lb, and loses no request when that host is drained or killed.

On the standard e2e fleet (c1, c2, vm1 behind lb1's nginx, the lb role's affinity routing on), stateless openai-SDK
conversations, each about its own image, go through nginx: every turn of a conversation is answered by the same
host (its X-Served-By). Then the host holding the most conversations is drained as a rollout drains it, and later
one is killed (SIGKILL, kept down, then started again): their conversations go on at once on other hosts with no
failed request, the others stay where they were, and once the host is back every conversation is where it was
before.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from ops.bench import fleet_locality
from ops.fleet import Fleet, Timeouts, load_inventory
from tests.e2e.hostcmd import sudo
from tests.reports import record

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

CONVERSATIONS = 9
BACK_BOUND_S = 240  # the killed host: systemd restart, model load on a busy 2-core machine, nginx's fail_timeout


class Conversations:
    """Stateless conversations through the lb: each turn re-sends the opening and the answers so far."""

    def __init__(self, inventory: Path):
        from ops.staging.inventory import hosts_of

        self.hosts = hosts_of(inventory)
        lb = next(h for h in self.hosts.values() if "lb" in h["groups"])
        base = f"http://{lb['ansible_host']}:80"
        model = json.loads(_get(lb["ansible_host"], "/v1/models"))["data"][0]["id"]
        self.client = fleet_locality.Client(base, model, fleet_locality.Plan(tokens=4, timeout_s=180))
        self.run_id = uuid.uuid4().hex[:8]
        self.histories: dict[int, list[dict]] = {}
        self.turns: list[fleet_locality.Turn] = []
        self.spilled: set[int] = set()  # conversations whose last turn a busy host passed on (lb_affinity_max_wait_s)

    def start(self, i: int) -> str:
        png = fleet_locality.image_data(self.run_id, i, (96, 64))
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        self.histories[i] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": f"What is in picture {i}?"}]}]
        return self._ask(i)

    def follow_up(self, i: int) -> str:
        self.histories[i].append({"role": "user", "content": f"And now? ({len(self.histories[i])})"})
        return self._ask(i)

    def round(self) -> dict[int, str]:
        """The next turn of every conversation: which host answered each."""
        return {i: self.follow_up(i) for i in sorted(self.histories)}

    def _ask(self, i: int) -> str:
        turn = fleet_locality.Turn(i, "openai", len(self.histories[i]))
        try:
            answer = self.client.openai(turn, self.histories[i])
        except Exception as e:  # a failed request is the finding: keep it for the assertion with the others
            turn.error, answer = f"{type(e).__name__}: {e}"[:300], ""
        self.histories[i].append({"role": "assistant", "content": answer})
        self.turns.append(turn)
        (self.spilled.add if turn.route in ("spill", "overflow") else self.spilled.discard)(i)
        return turn.host

    def failed(self) -> list[dict]:
        return [vars(t) for t in self.turns if t.status != 200 or t.error or not t.host]


def _get(address: str, path: str, port: int = 80) -> bytes:
    conn = http.client.HTTPConnection(address, port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def _refused(address: str, port: int = 8000) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _readyz(address: str) -> bool:
    try:
        return json.loads(_get(address, "/readyz", 8000)).get("ready") is True
    except (OSError, ValueError):
        return False


def _until(predicate, bound_s: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + bound_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not within {bound_s:.0f} s: {what}")
        time.sleep(interval)


@pytest.fixture(scope="module")
def placed(converged_inventory):
    """Conversations started on the fleet, each asked twice, and the host that answered them."""
    talk = Conversations(converged_inventory)
    first = {i: talk.start(i) for i in range(CONVERSATIONS)}
    second = talk.round()
    assert not talk.failed(), talk.failed()
    _moves(talk, first, second, away=None)
    assert len(set(first.values())) >= 2, f"{CONVERSATIONS} conversations all on one host: {first}"
    return talk, first


def _moves(talk: Conversations, before: dict[int, str], after: dict[int, str], away: str | None) -> None:
    """The conversations ``away`` held went elsewhere; the others stayed where they were, unless their host was too
    busy for the turn and nginx passed it on (its route says so: bounded load, not a lost placement)."""
    for i, host in before.items():
        if host == away:
            assert after[i] != away, f"conversation {i} still on {away}"
        elif i not in talk.spilled:
            assert after[i] == host, f"conversation {i} moved from {host} to {after[i]}, though {host} stayed up"


def _back(talk: Conversations, home: dict[int, str]) -> bool:
    """The next round found every conversation on its own host (bar a turn a busy host passed on)."""
    after = talk.round()
    return all(after[i] == host or i in talk.spilled for i, host in home.items())


def test_a_drained_host_hands_its_conversations_on_and_gets_them_back(converged_inventory, placed):
    talk, home = placed
    gone = Counter(home.values()).most_common(1)[0][0]
    with Fleet(load_inventory(converged_inventory), timeouts=Timeouts(drain=60, ready=600)) as fleet:
        fleet.set_drained([gone], [])
        try:
            during = talk.round()
        finally:
            fleet.set_drained([], [gone])
    back = talk.round()
    assert not talk.failed(), talk.failed()
    _moves(talk, home, during, gone)
    _moves(talk, home, back, away=None)  # every conversation where it was before the drain
    record("affinity-drain-e2e", {"drained": gone, "moved": sum(h == gone for h in home.values()),
                                  "conversations": CONVERSATIONS, "requests": len(talk.turns), "failures": 0})


def test_a_killed_host_loses_no_request_and_its_conversations_return(converged_inventory, placed):
    talk, home = placed
    containers = [n for n in home.values() if talk.hosts[n].get("vlfleet_staging_kind") == "container"]
    victim = Counter(containers).most_common(1)[0][0]  # a container: it restarts in seconds, a TCG VM in minutes
    host = talk.hosts[victim]
    before = len(talk.turns)
    # SIGKILL to every process of the service, then kept down (stop cancels systemd's restart, which on the tiny
    # model would be back before the next turn) until it is started again: its conversations must go on meanwhile.
    sudo(host, "systemctl kill --signal=SIGKILL vlfleet.service; systemctl stop vlfleet.service")
    # In a container systemd cannot kill the whole cgroup: gunicorn's worker outlives its master for a moment
    _until(lambda: _refused(host["ansible_host"]), 60, f"{victim}'s service port closed")
    during = talk.round()  # the host refuses connections: nginx passes each turn on
    _moves(talk, home, during, victim)
    sudo(host, "systemctl reset-failed vlfleet.service; systemctl start vlfleet.service")
    _until(lambda: _readyz(host["ansible_host"]), BACK_BOUND_S, f"{victim} ready again after its restart")
    # nginx tries a failed host again after lb_fail_timeout: then the conversations are where they were
    _until(lambda: _back(talk, home), BACK_BOUND_S, f"conversations back on {victim}")
    assert not talk.failed(), talk.failed()
    record("affinity-kill-e2e", {"killed": victim, "moved": sum(h == victim for h in home.values()),
                                 "conversations": CONVERSATIONS, "requests": len(talk.turns) - before,
                                 "failures": 0})

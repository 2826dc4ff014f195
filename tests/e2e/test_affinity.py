"""A conversation keeps its host through the lb, and loses no request when that host is drained or killed.

On the standard e2e fleet (c1, c2, vm1 behind lb1's nginx, the lb role's affinity routing on), stateless openai-SDK
conversations, each about its own image, go through nginx: every turn of a conversation is answered by the same
host (its X-Served-By). Then the host holding the most conversations is drained as a rollout drains it, and later
one is killed (kill -9, systemd restarts it): their conversations go on at once on other hosts with no failed
request, the others stay where they were, and once the host is back every conversation is where it was before.
"""

from __future__ import annotations

import base64
import http.client
import json
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
    assert second == first, f"conversations changed hosts between their first two turns: {first} -> {second}"
    assert len(set(first.values())) >= 2, f"{CONVERSATIONS} conversations all on one host: {first}"
    return talk, first


def _moves(before: dict[int, str], after: dict[int, str], away: str) -> None:
    """The conversations ``away`` held went elsewhere; the others stayed where they were."""
    for i, host in before.items():
        if host == away:
            assert after[i] != away, f"conversation {i} still on {away}"
        else:
            assert after[i] == host, f"conversation {i} moved from {host} to {after[i]}, though {host} stayed up"


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
    _moves(home, during, gone)
    assert back == home, f"after {gone} came back: {back}, before: {home}"
    record("affinity-drain-e2e", {"drained": gone, "moved": sum(h == gone for h in home.values()),
                                  "conversations": CONVERSATIONS, "requests": len(talk.turns), "failures": 0})


def test_a_killed_host_loses_no_request_and_its_conversations_return(converged_inventory, placed):
    talk, home = placed
    containers = [n for n in home.values() if talk.hosts[n].get("vlfleet_staging_kind") == "container"]
    victim = Counter(containers).most_common(1)[0][0]  # a container: it restarts in seconds, a TCG VM in minutes
    host = talk.hosts[victim]
    before = len(talk.turns)
    sudo(host, "kill -9 $(systemctl show -p MainPID --value vlfleet.service)")
    during = talk.round()  # at once: the host is restarting (refused) or loading (503): nginx moves on
    _moves(home, during, victim)
    _until(lambda: _readyz(host["ansible_host"]), BACK_BOUND_S, f"{victim} ready again after kill -9")
    # nginx tries a failed host again after lb_fail_timeout: then the conversations are where they were
    _until(lambda: talk.round() == home, BACK_BOUND_S, f"conversations back on {victim}")
    assert not talk.failed(), talk.failed()
    record("affinity-kill-e2e", {"killed": victim, "moved": sum(h == victim for h in home.values()),
                                 "conversations": CONVERSATIONS, "requests": len(talk.turns) - before,
                                 "failures": 0})

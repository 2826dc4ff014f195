"""Rollout, rollback and abort through real Fabric Connections against Fabric's MockRemote (no network).

Each host's Session lists what its host program answers, in order; the tests then read which agent subcommands
Fabric actually ran on each host and on the lb, which is where "the remaining hosts were never touched" shows.
"""

from __future__ import annotations

import json

import pytest
from fabric.testing.base import Command, MockRemote, Session
from paramiko.ssh_exception import NoValidConnectionsError, SSHException

from ops import fleet as ops_fleet
from ops.fleet import Fleet, Outcome, Release, Timeouts
from ops.fleet.inventory import parse_inventory_json
from ops.fleet.transport import step_args, step_name

ADDR = {"h1": "10.9.0.11", "h2": "10.9.0.12", "h3": "10.9.0.13", "lb1": "10.9.0.10"}


def _inventory():
    hostvars = {h: {"ansible_host": a, "ansible_user": "deploy", "ansible_python_interpreter": "/usr/bin/python3"}
                for h, a in ADDR.items()}
    return parse_inventory_json({"_meta": {"hostvars": hostvars}, "all": {"children": ["vlm", "lb"]},
                                 "vlm": {"hosts": ["h1", "h2", "h3"]}, "lb": {"hosts": ["lb1"]}})


def _answer(payload: dict, exit: int = 0) -> Command:
    return Command(out=(json.dumps(payload) + "\n").encode(), exit=exit)


DESCRIBE = _answer({"current": "r1", "previous": None, "env": {"VLFLEET_PORT": "8000", "VLFLEET_RELEASE_ID": "r1"},
                    "releases": [{"id": "r1", "complete": True, "wheelhouse_sha": "aa", "mtime": 1.0}],
                    "models": ["a1"]})
STAGE = _answer({"release": "r2", "venv": "copied from r1", "env_changed": True, "seconds": 0.2})
QUIESCE = _answer({"left": 0, "waited_s": 1.0})
READY = _answer({"ok": True, "ready_s": 3.0, "smoke": {"ok": True, "tokens": 4, "seconds": 0.3}, "release": "r2",
                 "from": "r1"})
NOT_READY = _answer({"ok": False, "reason": "the service exited (activating/auto-restart, exit status 2)",
                     "journal": ["vlfleet-serve: VLFLEET_QUEUE_SIZE='0' is not valid"], "release": "r2",
                     "from": "r1"})
BACK = _answer({"ok": True, "ready_s": 2.0, "smoke": {"ok": True, "tokens": 4, "seconds": 0.3}, "release": "r1",
                "from": "r2"})
PRUNE = _answer({"removed": [], "kept": ["r2", "r1"]})
LB = _answer({"changed": True, "drained": []})


def _session(host: str, *commands: Command) -> Session:
    return Session(host=ADDR[host], user="deploy", commands=list(commands)) if commands else Session(host=ADDR[host])


def _ran(session: Session) -> list[tuple[str, dict]]:
    return [(step_name(ch.exec_command.call_args[0][0]), step_args(ch.exec_command.call_args[0][0]))
            for ch in session.channels if ch.exec_command.called]


@pytest.fixture
def remote():
    mock = MockRemote()
    yield mock
    mock.stop()


def _fleet() -> Fleet:
    return Fleet(_inventory(), timeouts=Timeouts(drain=5, ready=30), echo=None, ship=False)


def test_rollout_goes_host_by_host_with_drain_gate_undrain(remote):
    sessions = [_session(h, DESCRIBE, STAGE, QUIESCE, READY, PRUNE) for h in ("h1", "h2", "h3")]
    lb = _session("lb1", *[LB] * 6)
    remote.expect_sessions(*sessions, lb)
    with _fleet() as f:
        report = ops_fleet.rollout(f, Release("r2"), batch="1,25%,50%")
    assert report.ok, report.table()
    assert [(r.host, r.outcome, r.release, r.batch) for r in report.results] == [
        ("h1", Outcome.OK, "r2", 1), ("h2", Outcome.OK, "r2", 2), ("h3", Outcome.OK, "r2", 3)]
    for s in sessions:
        ran = _ran(s)
        assert [name for name, _ in ran] == ["describe", "stage", "quiesce", "activate", "prune"]
        stage, activate = ran[1][1], ran[3][1]
        assert stage["venv_from"] == stage["env_from"] == "r1"
        assert stage["changes"]["VLFLEET_RELEASE_ID"] == "r2"
        assert activate["release"] == "r2" and activate["timeout"] == 30
    lb_ops = [(a["drain"], a["undrain"]) for _, a in _ran(lb)]
    assert lb_ops == [(["h1"], []), ([], ["h1"]), (["h2"], []), ([], ["h2"]), (["h3"], []), ([], ["h3"])]


def test_a_host_the_operator_drained_gets_the_release_and_stays_drained(remote):
    """lb_drained_hosts (the lb role's persistent switch) names h2: the rollout drains and changes it like the others,
    and never asks the lb to put it back."""
    sessions = [_session(h, DESCRIBE, STAGE, QUIESCE, READY, PRUNE) for h in ("h1", "h2", "h3")]
    lb = _session("lb1", *[LB] * 6)
    remote.expect_sessions(*sessions, lb)
    inventory = _inventory()
    inventory.hosts["lb1"].vars["lb_drained_hosts"] = ["h2"]
    with Fleet(inventory, timeouts=Timeouts(drain=5, ready=30), echo=None, ship=False) as f:
        report = ops_fleet.rollout(f, Release("r2"), batch="1")
    assert report.ok and [r.release for r in report.results] == ["r2", "r2", "r2"], report.table()
    lb_ops = [(a["drain"], a["undrain"]) for _, a in _ran(lb)]
    assert lb_ops == [(["h1"], []), ([], ["h1"]), (["h2"], []), ([], []), (["h3"], []), ([], ["h3"])]


def test_failed_canary_is_rolled_back_and_nothing_else_is_touched(remote):
    h1 = _session("h1", DESCRIBE, STAGE, QUIESCE, NOT_READY, BACK)
    h2, h3 = _session("h2"), _session("h3")
    lb = _session("lb1", LB, LB)
    remote.expect_sessions(h1, h2, h3, lb)
    with _fleet() as f:
        report = ops_fleet.rollout(f, Release("r2", env={"VLFLEET_QUEUE_SIZE": "0"}), max_fail=0)
    r1 = report.results[0]
    assert r1.outcome is Outcome.ROLLED_BACK and r1.release == "r1"
    assert "exited" in r1.message and "VLFLEET_QUEUE_SIZE" in r1.message and "back on r1" in r1.message
    assert [a["release"] for name, a in _ran(h1) if name == "activate"] == ["r2", "r1"]
    assert [r.outcome for r in report.results[1:]] == [Outcome.SKIPPED, Outcome.SKIPPED]
    assert report.stopped and not report.ok
    # never connected, never ran anything
    assert not h2.client.connect.called and not h3.client.connect.called
    assert [(a["drain"], a["undrain"]) for _, a in _ran(lb)] == [(["h1"], []), ([], ["h1"])]


def test_a_host_that_vanishes_mid_batch_is_reported_and_left_drained(remote):
    h1 = _session("h1", DESCRIBE, STAGE, QUIESCE, READY, PRUNE)
    h2 = _session("h2", DESCRIBE, STAGE, QUIESCE, READY)
    h3 = _session("h3", DESCRIBE, STAGE, QUIESCE, READY, PRUNE)
    lb = _session("lb1", *[LB] * 5)
    remote.expect_sessions(h1, h2, h3, lb)
    # h2's SSH transport dies when the restart is about to run
    transport = h2.client.get_transport.return_value
    transport.open_session.side_effect = [*h2.channels[:3], SSHException("SSH session not active")]
    with _fleet() as f:
        report = ops_fleet.rollout(f, Release("r2"), batch="1", max_fail=1)
    by_host = {r.host: r for r in report.results}
    assert by_host["h2"].outcome is Outcome.UNREACHABLE
    assert "connection lost" in by_host["h2"].message and "left out of nginx" in by_host["h2"].message
    assert by_host["h1"].outcome is by_host["h3"].outcome is Outcome.OK  # max_fail 1: carried on
    assert [(a["drain"], a["undrain"]) for _, a in _ran(lb)] == [
        (["h1"], []), ([], ["h1"]), (["h2"], []), (["h3"], []), ([], ["h3"])]


def test_an_unreachable_canary_stops_before_any_change(remote):
    h1, h2, h3, lb = _session("h1", DESCRIBE), _session("h2"), _session("h3"), _session("lb1")
    remote.expect_sessions(h1, h2, h3, lb)
    h1.client.connect.side_effect = NoValidConnectionsError({(ADDR["h1"], 22): ConnectionRefusedError(111, "no")})
    with _fleet() as f:
        report = ops_fleet.rollout(f, Release("r2"))
    first = report.results[0]
    assert first.outcome is Outcome.UNREACHABLE and "still serving" in first.message
    assert [r.outcome for r in report.results[1:]] == [Outcome.SKIPPED, Outcome.SKIPPED]
    assert not _ran(lb)


def test_rollback_goes_to_the_previous_release(remote):
    described = _answer({"current": "r2", "previous": "r1", "env": {}, "models": [],
                         "releases": [{"id": "r1", "complete": True, "wheelhouse_sha": "aa", "mtime": 1.0},
                                      {"id": "r2", "complete": True, "wheelhouse_sha": "aa", "mtime": 2.0}]})
    sessions = [_session(h, described, QUIESCE, BACK) for h in ("h1", "h2", "h3")]
    lb = _session("lb1", *[LB] * 6)
    remote.expect_sessions(*sessions, lb)
    with _fleet() as f:
        report = ops_fleet.rollback(f, batch="100%", parallel=2)
    assert report.ok and {r.release for r in report.results} == {"r1"}
    assert all([a.get("release") for n, a in _ran(s) if n == "activate"] == ["r1"] for s in sessions)


def test_a_venv_built_from_the_same_wheelhouse_is_reused_not_uploaded(remote, tmp_path):
    import hashlib

    (tmp_path / "requirements.txt").write_text("flask==3.1.3 --hash=sha256:00\n")
    sha = hashlib.sha256((tmp_path / "requirements.txt").read_bytes()).hexdigest()
    # the site release python_runtime named after this wheelhouse
    described = _answer({"current": "r1", "previous": None, "env": {}, "models": [],
                         "releases": [{"id": "r1", "complete": True, "wheelhouse_sha": None, "mtime": 1.0},
                                      {"id": sha[:12], "complete": True, "wheelhouse_sha": None, "mtime": 2.0}]})
    h1 = _session("h1", described, STAGE, QUIESCE, READY, PRUNE)
    remote.expect_sessions(h1, _session("lb1", LB, LB))
    with Fleet(_inventory(), limit=["h1"], timeouts=Timeouts(drain=5, ready=30), echo=None, ship=False) as f:
        report = ops_fleet.rollout(f, Release("r2", wheelhouse=tmp_path))
    assert [(r.host, r.outcome) for r in report.results] == [("h1", Outcome.OK)]
    stage = dict(_ran(h1))["stage"]
    assert stage["venv_from"] == sha[:12] and "wheelhouse" not in stage
    assert not h1.client.open_sftp.called  # nothing uploaded

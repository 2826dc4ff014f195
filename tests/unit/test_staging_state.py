"""state.json: every recorded object survives a reload, in creation order; removal of real objects works."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from ops.staging import resources
from ops.staging.state import FleetState, HostRecord, Resource, StateStore


def _store(tmp_path) -> StateStore:
    return StateStore(tmp_path / "state.json", FleetState("t", "10.250.77.0/24", "vlbabc"))


def test_records_survive_reload_in_order(tmp_path):
    store = _store(tmp_path)
    store.record("link", "vlbabc")
    store.record("dir", tmp_path / "hosts/c1", "c1")
    store.record("process", 123, "c1", start_time="42")
    store.set_host(HostRecord("c1", "container", "10.250.77.11", ["vlm"]))
    loaded = StateStore.load(tmp_path / "state.json")
    assert loaded is not None
    assert [(r.kind, r.id, r.host) for r in loaded.state.resources] == [
        ("link", "vlbabc", ""), ("dir", str(tmp_path / "hosts/c1"), "c1"), ("process", "123", "c1")]
    assert loaded.state.resources[2].extra == {"start_time": "42"}
    assert loaded.state.hosts["c1"].ip == "10.250.77.11"
    assert [r.id for r in loaded.state.host_resources("c1")] == [str(tmp_path / "hosts/c1"), "123"]


def test_forget_removes_only_that_record(tmp_path):
    store = _store(tmp_path)
    a = store.record("file", tmp_path / "a")
    store.record("file", tmp_path / "a")  # same id twice: forgetting one keeps the other
    store.forget(a)
    assert len(StateStore.load(store.path).state.resources) == 1


def test_concurrent_records_are_all_kept(tmp_path):
    store = _store(tmp_path)
    threads = [threading.Thread(target=lambda i=i: [store.record("file", f"/x/{i}/{j}", f"h{i}") for j in range(20)])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(StateStore.load(store.path).state.resources) == 80


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown resource kind"):
        Resource("volume", "x")


def test_missing_state_is_none(tmp_path):
    assert StateStore.load(tmp_path / "nope.json") is None


def test_remove_file_and_dir(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    d = tmp_path / "d" / "sub"
    d.mkdir(parents=True)
    for res in (Resource("file", str(f)), Resource("dir", str(tmp_path / "d"))):
        assert resources.exists(res)
        resources.remove(res)
        assert not resources.exists(res)
    resources.remove(Resource("file", str(f)))  # already gone counts as removed


def test_process_identity_guards_against_pid_reuse():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        start = resources.proc_start_time(proc.pid)
        # Clock ticks since boot, for a process started just now: about the uptime, and not this process's.
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        assert start.isdigit() and abs(int(start) / os.sysconf("SC_CLK_TCK") - uptime) < 60, (start, uptime)
        assert start != resources.proc_start_time(os.getpid())
        ours = Resource("process", str(proc.pid), extra={"start_time": start})
        stranger = Resource("process", str(proc.pid), extra={"start_time": str(int(start) + 1)})
        assert resources.exists(ours)
        assert not resources.exists(stranger)  # same pid, other start time: never signalled
        resources.remove(stranger)
        assert proc.poll() is None
        resources.remove(ours, stop_timeout=10)
        assert proc.wait(timeout=10) is not None
        assert not resources.exists(ours)
        assert resources.proc_start_time(proc.pid) == ""  # reaped: no such process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

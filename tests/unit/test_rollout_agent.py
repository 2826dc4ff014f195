"""The host side of fleet operations (the host program, ops/host/, the one owner of the release steps) on local
directories, its command line as Fabric sends it, and the archive the roles run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.fleet import Release, StepError, host_program
from ops.fleet.inventory import parse_inventory_json
from ops.fleet.release import release_changes
from ops.fleet.transport import parse_step_output, step_args, step_command, step_name
from ops.host import client, envfile, gate, layout, lb, release, tune
from ops.host.errors import HostError
from ops.host.gate import established_clients
from ops.host.lb import set_drained
from tests import nginx_site

REPO = Path(__file__).resolve().parents[2]
BACKENDS = [("c1", "10.250.77.11"), ("c2", "10.250.77.12"), ("vm1", "10.250.77.101")]


def _site(drained: list[str]) -> str:
    """The nginx site exactly as the lb role renders it for ``drained`` (lb_drained_hosts)."""
    return nginx_site.site([{"name": n, "address": a, "port": 8000, "down": n in drained} for n, a in BACKENDS],
                           lb_listen_port=80)


def test_drain_edit_equals_what_the_lb_role_renders():
    text, drained = set_drained(_site([]), ["c1"], [])
    assert text == _site(["c1"]) and drained == ["c1"]
    text, drained = set_drained(text, ["vm1"], ["c1"])
    assert text == _site(["vm1"]) and drained == ["vm1"]
    text, drained = set_drained(text, [], ["vm1"])
    assert text == _site([]) and drained == []


def test_drain_is_idempotent_and_keeps_other_drained_hosts():
    once, _ = set_drained(_site(["c2"]), ["c1"], [])
    twice, drained = set_drained(once, ["c1"], [])
    assert once == twice == _site(["c1", "c2"]) and drained == ["c1", "c2"]


def test_drain_of_a_host_the_site_does_not_list_says_to_converge():
    with pytest.raises(HostError, match=r"no upstream server for c9.*site\.yml"):
        set_drained(_site([]), ["c9"], [])


def _release(root: Path, rid: str, env: str = "VLFLEET_PORT=8000\n") -> Path:
    venv = root / "releases" / rid / "venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "marker.py").write_text(f"RELEASE = {rid!r}\n")
    (venv / layout.COMPLETE).touch()
    (root / "releases" / rid / "vlfleet.env").write_text(env)
    return root / "releases" / rid


def test_switch_keeps_previous_and_is_a_symlink_swap(tmp_path):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2")
    assert release.switch(tmp_path, "r1") is None
    assert release.switch(tmp_path, "r2") == "r1"
    assert os.readlink(tmp_path / "current") == str(tmp_path / "releases" / "r2")
    assert layout.link_target(tmp_path / "previous") == "r1"
    assert release.switch(tmp_path, "r2") == "r2"  # no-op: previous stays r1
    assert layout.link_target(tmp_path / "previous") == "r1"
    with pytest.raises(HostError, match="not staged"):
        release.switch(tmp_path, "r3")
    with pytest.raises(HostError, match="release id"):
        release.switch(tmp_path, "../etc")


@pytest.mark.skipif(os.geteuid() != 0, reason="stage chowns the env file to root")
def test_stage_copies_the_current_venv_and_writes_the_env(tmp_path):
    _release(tmp_path, "r1")
    release.switch(tmp_path, "r1")
    args = {"root": str(tmp_path), "release": "r2", "venv_from": "r1", "group": "root",
            "changes": {"VLFLEET_RELEASE_ID": "r2"}}
    out = release.stage(args)
    assert out["venv"] == "copied from r1" and out["env_changed"] is True and out["changed"] is True
    new = tmp_path / "releases" / "r2"
    assert (new / "venv" / layout.COMPLETE).is_file()
    # hard links: same inode, no second copy on disk
    assert (new / "venv" / "lib" / "marker.py").stat().st_ino == \
        (tmp_path / "releases" / "r1" / "venv" / "lib" / "marker.py").stat().st_ino
    # the changes on top of the running release's env file
    assert (new / "vlfleet.env").read_text() == envfile.ENV_HEADER + "VLFLEET_PORT=8000\nVLFLEET_RELEASE_ID=r2\n"
    assert oct((new / "vlfleet.env").stat().st_mode & 0o777) == "0o640"
    again = release.stage(args)
    assert again["venv"] == "kept" and not again["env_changed"] and not again["changed"]
    described = release.describe({"root": str(tmp_path)})
    assert described["current"] == "r1" and described["env"] == {"VLFLEET_PORT": "8000"}
    assert [r["id"] for r in described["releases"] if r["complete"]] == ["r1", "r2"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the env step chowns the env file to root")
def test_env_step_writes_the_roles_settings_once_and_check_mode_changes_nothing(tmp_path):
    _release(tmp_path, "r1", env="")
    settings = {"VLFLEET_PORT": 8000, "VLFLEET_HOST": "127.0.0.1", "VLFLEET_RELEASE_ID": "r1"}
    args = {"root": str(tmp_path), "release": "r1", "group": "root", "settings": settings}
    assert envfile.write_env({**args, "check": True})["changed"] is True
    assert (tmp_path / "releases" / "r1" / "vlfleet.env").read_text() == ""  # check mode: untouched
    assert envfile.write_env(args)["changed"] is True
    assert layout.read_env(tmp_path / "releases" / "r1" / "vlfleet.env") == \
        {"VLFLEET_PORT": "8000", "VLFLEET_HOST": "127.0.0.1", "VLFLEET_RELEASE_ID": "r1"}
    assert envfile.write_env(args)["changed"] is False
    assert envfile.write_env({**args, "check": True})["changed"] is False
    os.chmod(tmp_path / "releases" / "r1" / "vlfleet.env", 0o644)  # a mode changed by hand is put back
    assert envfile.write_env(args)["changed"] is True
    with pytest.raises(HostError, match="NAME=value"):
        envfile.write_env({**args, "settings": {"VLFLEET_MODEL_NAME": "a\nb"}})


def test_venv_step_prepares_reports_and_previews(tmp_path):
    args = {"root": str(tmp_path), "release": "r1"}
    assert release.venv({**args, "check": True}) == \
        {"changed": True, "complete": False, "release": "r1", "venv": "to be made"}
    assert not (tmp_path / "releases").exists()  # check mode makes nothing
    out = release.venv({**args, "prepare": True})
    assert out["changed"] and not out["complete"] and (tmp_path / "releases" / "r1").is_dir()
    assert not release.venv({**args, "prepare": True})["changed"]
    with pytest.raises(HostError, match="no wheelhouse archive"):
        release.venv({**args, "wheelhouse_tar": str(tmp_path / "missing.tar")})
    with pytest.raises(HostError, match="no venv yet"):
        release.venv(args)
    _release(tmp_path, "r2")
    assert release.venv({"root": str(tmp_path), "release": "r2", "check": True})["changed"] is False


def test_switch_step_reports_changed_and_previews_in_check_mode(tmp_path):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2")
    root = str(tmp_path)
    assert release.switch_step({"root": root, "release": "r1"})["changed"] is True
    assert release.switch_step({"root": root, "release": "r2", "check": True}) == \
        {"changed": True, "from": "r1", "current": "r2", "previous": "r1"}
    assert layout.link_target(tmp_path / "current") == "r1"  # only previewed
    assert release.switch_step({"root": root, "release": "r2"})["changed"] is True
    assert release.switch_step({"root": root, "release": "r2"}) == \
        {"changed": False, "from": "r2", "current": "r2", "previous": "r1"}


def test_prune_keeps_the_newest_and_never_current_or_previous(tmp_path):
    for i, rid in enumerate(["r1", "r2", "r3", "r4", "r5"]):
        d = _release(tmp_path, rid)
        os.utime(d, (1000 + i, 1000 + i))
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")  # current r2, previous r1: both old, both kept
    assert release.prune({"root": str(tmp_path), "keep": 2, "check": True})["removed"] == ["r3"]
    assert len(list((tmp_path / "releases").iterdir())) == 5  # check mode removes nothing
    out = release.prune({"root": str(tmp_path), "keep": 2})
    assert sorted(out["removed"]) == ["r3"] and out["changed"]
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["r1", "r2", "r4", "r5"]
    out = release.prune({"root": str(tmp_path), "keep": 1, "protect": ["r5"]})
    assert out["removed"] == ["r4"]
    assert release.prune({"root": str(tmp_path), "keep": 1, "protect": ["r5"]})["changed"] is False


def test_prune_of_models_keeps_what_current_and_previous_use(tmp_path):
    for i, aid in enumerate(["a1", "a2", "a3", "a4"]):
        (tmp_path / "models" / aid).mkdir(parents=True)
        os.utime(tmp_path / "models" / aid, (1000 + i, 1000 + i))
    _release(tmp_path, "r1", env=f"VLFLEET_MODEL_DIR={tmp_path}/models/a1\n")
    # the GGUF artifact the llamacpp engine serves is in use as much as the OpenVINO one
    _release(tmp_path, "r2", env=f"VLFLEET_MODEL_DIR={tmp_path}/models/a2\n"
                                 f"VLFLEET_LLAMACPP_MODEL_DIR={tmp_path}/models/a3\n")
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")
    out = release.prune({"root": str(tmp_path), "kind": "models", "keep": 1})
    assert out["removed"] == [], out
    (tmp_path / "models" / "a0").mkdir()
    os.utime(tmp_path / "models" / "a0", (999, 999))
    out = release.prune({"root": str(tmp_path), "kind": "models", "keep": 1, "protect": ["a4"]})
    assert out["removed"] == ["a0"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["a1", "a2", "a3", "a4"]
    with pytest.raises(HostError, match="kind"):
        release.prune({"root": str(tmp_path), "kind": "etc"})


def test_llama_server_is_the_envs_else_the_release_venvs_with_its_gguf_artifact(tmp_path):
    site = Path("lib") / "python3.10" / "site-packages" / "vlfleet_llama_server" / "bin"
    venv_bin = _release(tmp_path, "r1") / "venv" / site
    venv_bin.mkdir(parents=True)
    (venv_bin / "llama-server").write_text("#!/bin/sh\n")
    (venv_bin / "llama-server").chmod(0o755)
    (tmp_path / "models" / "g1").mkdir(parents=True)
    (tmp_path / "models" / "g1" / "manifest.json").write_text("{}")
    release.switch(tmp_path, "r1")
    found = tune.llama_server(tmp_path, {"VLFLEET_LLAMACPP_MODEL_DIR": str(tmp_path / "models" / "g1")})
    assert found == {"path": str(tmp_path / "current" / "venv" / site / "llama-server"),
                     "exists": True, "model_dir": str(tmp_path / "models" / "g1"), "model_exists": True}
    named = tune.llama_server(tmp_path, {"VLFLEET_LLAMACPP_SERVER": "/nowhere/llama-server"})
    assert named == {"path": "/nowhere/llama-server", "exists": False, "model_dir": "", "model_exists": False}


def test_established_clients_counts_remote_peers_on_the_port_only(tmp_path):
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [
        "0: 0B4DFA0A:1F40 0A4DFA0A:A000 01 00000000:00000000 00:00000000 00000000 0 0 1",  # from the lb: counts
        "1: 0B4DFA0A:1F40 0A4DFA0A:A001 06 00000000:00000000 00:00000000 00000000 0 0 2",  # TIME_WAIT: not
        "2: 0100007F:1F40 0100007F:A002 01 00000000:00000000 00:00000000 00000000 0 0 3",  # loopback probe: not
        "3: 0B4DFA0A:0016 0A4DFA0A:A003 01 00000000:00000000 00:00000000 00000000 0 0 4",  # ssh: not
        "4: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 5",  # listener: not
    ]
    (tmp_path / "tcp").write_text(header + "\n".join(rows) + "\n")
    (tmp_path / "tcp6").write_text(header + "0: 00000000000000000000000001000000:1F40 "
                                   "00000000000000000000000001000000:A004 01 0 0 0 0 0 6\n")
    assert established_clients(8000, tmp_path) == 1


def test_the_host_program_runs_from_its_command_line(tmp_path):
    _release(tmp_path, "r1")
    release.switch(tmp_path, "r1")
    program = str(host_program.build().path)
    cmd = step_command(sys.executable, program, "describe", {"root": str(tmp_path)})
    assert cmd.startswith("sudo -n ") and step_name(cmd) == "describe"
    assert step_args(cmd) == {"root": str(tmp_path)}
    local = cmd.removeprefix("sudo -n ")
    done = subprocess.run(local, shell=True, capture_output=True, text=True, timeout=60)
    assert parse_step_output(done.stdout, done.stderr, done.returncode)["current"] == "r1"
    bad = subprocess.run(step_command(sys.executable, program, "stage", {"root": str(tmp_path), "release": "r9"})
                         .removeprefix("sudo -n "), shell=True, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    with pytest.raises(StepError, match="no venv yet"):
        parse_step_output(bad.stdout, bad.stderr, bad.returncode)


def test_the_roles_run_the_same_archive_with_plain_json_or_base64(tmp_path):
    # ansible.builtin.script runs the host program's archive with the host's python3: STEP ARGS, JSON answer
    import base64
    import json

    _release(tmp_path, "r1")
    agent = host_program.build().path
    for arg in (json.dumps({"root": str(tmp_path), "release": "r1"}),
                base64.b64encode(json.dumps({"root": str(tmp_path), "release": "r1"}).encode()).decode()):
        done = subprocess.run([sys.executable, str(agent), "switch", arg], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"changed": False, "from": "r1", "current": "r1",
                                                        "previous": None}
    roles = REPO / "roles"
    for role in ("python_runtime", "vlm_service", "model_artifact"):
        tasks = "".join(p.read_text() for p in (roles / role / "tasks").glob("*.yml"))
        assert "ansible.builtin.script" in tasks, role


def test_agent_crash_and_sudo_password_are_explained():
    with pytest.raises(StepError, match=r"exit 1\): .*KeyError"):
        parse_step_output("", "Traceback (most recent call last):\nKeyError: 'x'", 1)
    with pytest.raises(StepError, match="passwordless sudo"):
        parse_step_output("", "sudo: a password is required", 1)


def test_release_env_changes_only_what_the_release_changes(tmp_path):
    current = {"VLFLEET_HOST": "10.0.0.11", "VLFLEET_PORT": "8000", "VLFLEET_RELEASE_ID": "r1",
               "VLFLEET_MODEL_DIR": "/opt/vlfleet/models/a1", "VLFLEET_QUEUE_SIZE": "8"}
    changes = release_changes(Release("r2", env={"VLFLEET_QUEUE_SIZE": "", "VLFLEET_MAX_TOKENS": "64"}), "/opt/vlfleet")
    env = envfile.merged_env(current, changes)
    assert env == {"VLFLEET_HOST": "10.0.0.11", "VLFLEET_PORT": "8000", "VLFLEET_RELEASE_ID": "r2",
                   "VLFLEET_MODEL_DIR": "/opt/vlfleet/models/a1", "VLFLEET_MAX_TOKENS": "64"}
    text = envfile.env_text(env)
    assert text.startswith("# Managed by vlfleet") and "VLFLEET_RELEASE_ID=r2\n" in text
    assert layout.read_env(_write(tmp_path / "e", text)) == env


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_release_arguments_are_checked_before_anything_runs(tmp_path):
    from ops.fleet import FleetError

    with pytest.raises(FleetError, match="--release"):
        Release("bad id")
    with pytest.raises(FleetError, match=r"--wheelhouse .*requirements\.txt"):
        Release("r2", wheelhouse=tmp_path)
    with pytest.raises(FleetError, match="only VLFLEET_"):
        Release("r2", env={"PATH": "/x"})


def test_inventory_groups_resolve_children_in_order():
    inv = parse_inventory_json({
        "_meta": {"hostvars": {"c1": {"ansible_host": "10.0.0.11", "vlm_service_host": "{{ ansible_host }}"},
                               "c2": {}, "lb1": {"ansible_user": "deploy"}}},
        "all": {"children": ["ungrouped", "fleet", "lb"]},
        "fleet": {"children": ["vlm"]},
        "vlm": {"hosts": ["c1", "c2"]},
        "lb": {"hosts": ["lb1"]},
    })
    assert [h.name for h in inv.group("vlm")] == ["c1", "c2"]
    assert [h.name for h in inv.group("lb")] == ["lb1"]
    c1 = inv.hosts["c1"]
    assert c1.address == "10.0.0.11" and c1.var("vlm_service_host", "127.0.0.1") == "127.0.0.1"
    assert c1.root == "/opt/vlfleet" and c1.unit == "vlfleet"


def test_wait_ready_stops_at_once_when_the_model_failed_to_load(monkeypatch):
    """A service whose engine could not load its model lives on unready; waiting out the timeout (tune's, the
    release gate's) would only delay the failure. The reason comes from the engine's own words."""
    engine_source = (Path(__file__).resolve().parents[2] / "service" / "engine" / "base.py").read_text()
    assert f'f"{client.LOAD_FAILED}: {{e}}"' in engine_source
    reason = f"{client.LOAD_FAILED}: llama-server exited with code 127"
    polls = []
    monkeypatch.setattr(client, "readyz", lambda url, timeout: polls.append(url) or {
        "status": 503, "body": {"ready": False, "reason": reason}, "error": None})
    monkeypatch.setattr(gate, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running"})
    monkeypatch.setattr(gate, "journal_tail", lambda unit, since: "journal")
    out = gate.wait_ready(("127.0.0.1", 8000), "vlfleet", lambda body: True, timeout=600, since=None,
                                restarts=0)
    assert out == {"ok": False, "reason": f"http://127.0.0.1:8000 will not become ready: {reason}",
                   "journal": "journal"} and len(polls) == 1


def test_wait_ready_stops_at_once_when_the_engine_gave_up(monkeypatch):
    """/readyz "failed": true (service/http/health.py): the engine will not turn ready, whatever its reason says (a
    llama-server that died while loading on a restart, or did not come back)."""
    reason = "llama-server died while loading (SIGSEGV): ...; not tried again: restart the service"
    polls = []
    monkeypatch.setattr(client, "readyz", lambda url, timeout: polls.append(url) or {
        "status": 503, "body": {"ready": False, "reason": reason, "failed": True}, "error": None})
    monkeypatch.setattr(gate, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running"})
    monkeypatch.setattr(gate, "journal_tail", lambda unit, since: "journal")
    out = gate.wait_ready(("127.0.0.1", 8000), "vlfleet", lambda body: True, timeout=600, since=None,
                                restarts=0)
    assert out == {"ok": False, "reason": f"http://127.0.0.1:8000 will not become ready: {reason}",
                   "journal": "journal"} and len(polls) == 1


def _fake_nginx(root: Path, workers: dict[int, str]) -> dict:
    """A /proc with nginx's master (pid 10) and its ``workers`` (pid -> title), and its pid file."""
    (root / "nginx.pid").write_text("10\n")
    for pid, title in {10: "nginx: master process", 99: "sshd", **workers}.items():
        d = root / "proc" / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        parent = 1 if pid in (10, 99) else 10
        (d / "stat").write_text(f"{pid} (nginx) S {parent} {pid} {pid} 0 -1\n")
        (d / "cmdline").write_bytes(title.encode().replace(b" ", b"\0") + b"\0")
    return {"pidfile": root / "nginx.pid", "proc": root / "proc"}


def test_a_drain_returns_once_no_worker_with_the_old_site_accepts(tmp_path):
    where = _fake_nginx(tmp_path, {11: "nginx: worker process", 12: "nginx: worker process"})
    old = lb.nginx_workers(**where)
    assert sorted(old) == [11, 12]
    assert not lb.wait_workers_replaced(old, timeout=0.2, **where)  # the reload has not happened yet
    proc = tmp_path / "proc"
    (proc / "11" / "cmdline").write_bytes(b"nginx: worker process is shutting down\0")
    for f in (proc / "12").iterdir():  # 12 exited
        f.unlink()
    (proc / "12").rmdir()
    _fake_nginx(tmp_path, {13: "nginx: worker process"})
    assert lb.wait_workers_replaced(old, timeout=2, **where)

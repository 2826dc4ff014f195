"""What the service and the fleet side agree on (service/runtime/contract.py, from service/runtime/settings.py): the
host program's copy of it, the default engine `vlfleet tune` waits for, and VLFLEET_* names nothing reads, refused
at service start and by the host program's env step."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ops.fleet import Release, host_program
from ops.fleet.inventory import FleetError
from ops.fleet.transport import step_command
from ops.host import client, envfile, gate, layout, tune
from ops.host import contract as host_contract
from ops.host.errors import HostError
from service.runtime import contract, settings

REPO = Path(__file__).resolve().parents[2]


# -- `vlfleet tune`'s set_engine: which engine the service runs when nothing names one

def _host(tmp_path: Path, env: str) -> tuple[Path, Path]:
    """A host's release tree with one release whose env file is ``env``; the override file's path."""
    rel = tmp_path / "releases" / "r1"
    rel.mkdir(parents=True)
    (rel / "vlfleet.env").write_text(env)
    (tmp_path / "current").symlink_to(rel)
    return tmp_path, tmp_path / "etc" / "engine.env"


def _service_reading(monkeypatch, root: Path, override: Path) -> None:
    """Restarts and /readyz of a service that starts as the unit does: the release's env file, then the override
    file, read by the service's own settings; its /readyz names the engine it runs."""
    def readyz(url, timeout):
        env = layout.read_env(root / "current" / "vlfleet.env")
        env.update(layout.read_env(override) if override.is_file() else {})
        engine = settings.load({"VLFLEET_MODEL_DIR": "/m", **env}).engine
        return {"status": 200, "body": {"ready": True, "engine": engine}, "error": None}

    monkeypatch.setattr(tune, "restart_unit", lambda unit, stop_timeout: (0.0, 0))
    monkeypatch.setattr(gate, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running"})
    monkeypatch.setattr(gate, "journal_tail", lambda unit, since=None, lines=25: [])
    monkeypatch.setattr(client, "readyz", readyz)


def test_tune_putting_a_never_tuned_host_back_waits_for_the_engine_the_service_defaults_to(tmp_path, monkeypatch):
    """Issue 31: no engine won on a host no one had tuned, so tune calls set_engine(None). The agent removes the
    override and must wait for the engine the service then runs (settings' default), not a default of its own."""
    root, override = _host(tmp_path, "VLFLEET_PORT=8000\n")
    override.parent.mkdir()
    override.write_text(tune.override_text("serial"))  # what the measurements left behind
    _service_reading(monkeypatch, root, override)
    out = tune.set_engine({"root": str(root), "override": str(override), "engine": None, "timeout": 2})
    assert not override.exists()
    assert out["ok"], out
    assert out["engine"] == contract.DEFAULT_ENGINE == settings.load({"VLFLEET_MODEL_DIR": "/m"}).engine


def test_set_engine_waits_for_the_release_env_engine_or_the_one_asked(tmp_path, monkeypatch):
    root, override = _host(tmp_path, "VLFLEET_PORT=8000\nVLFLEET_ENGINE=batching\n")
    _service_reading(monkeypatch, root, override)
    back = tune.set_engine({"root": str(root), "override": str(override), "engine": None, "timeout": 2})
    assert back["ok"] and back["engine"] == "batching"
    asked = tune.set_engine({"root": str(root), "override": str(override), "engine": "serial", "timeout": 2})
    assert asked["ok"] and asked["engine"] == "serial"


# -- the host program's copy of the contract

def test_the_host_program_carries_the_contract_as_rendered_from_settings():
    source = (REPO / "ops" / "host" / "contract.py").read_text()
    assert source == contract.host_module(), (
        "ops/host/contract.py differs from service/runtime/contract.py's values: `python -m service.runtime.contract > "
        "ops/host/contract.py`")
    assert (host_contract.ENGINES, host_contract.DEFAULT_ENGINE, host_contract.SETTING_NAMES) == \
        (contract.ENGINES, contract.DEFAULT_ENGINE, contract.HOST_NAMES)
    assert [getattr(host_contract, name) for name in contract.FILES] == [getattr(contract, n) for n in contract.FILES]


def test_the_contract_is_what_settings_accepts():
    engine = next(f for f in settings.FIELDS if f.name == "engine")
    assert contract.DEFAULT_ENGINE == engine.default == contract.ENGINES[0]
    for name in contract.ENGINES:
        assert settings.load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_ENGINE": name}).engine == name
        assert tune.override_text(name).endswith(f"VLFLEET_ENGINE={name}\n")
    with pytest.raises(settings.SettingsError, match="expected direct, serial, batching, llamacpp, hybrid or paged"):
        settings.load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_ENGINE": "vllm"})
    assert set(contract.HOST_NAMES) >= {f.env for f in settings.FIELDS} | {"VLFLEET_CPUS", "VLFLEET_CPU_PLAN_FILE"}


def _shipped_agent(step: str, args: dict, cwd: Path) -> dict:
    """Run the host program's archive as Fabric runs it, isolated: no repository on its path."""
    argv = shlex.split(step_command(sys.executable, str(host_program.build().path), step, args))[2:]  # no `sudo -n`
    done = subprocess.run([argv[0], "-I", *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_shipped_agent_needs_no_service_code_and_refuses_a_misspelt_setting(tmp_path):
    answer = _shipped_agent("env", {"root": str(tmp_path), "release": "r1", "check": True,
                                    "settings": {"VLFLEET_PORT": "8000", "VLFLEET_ENGNE": "serial"}}, tmp_path)
    assert "VLFLEET_ENGNE is not a setting (did you mean VLFLEET_ENGINE?)" in answer["error"], answer
    ok = _shipped_agent("env", {"root": str(tmp_path), "release": "r1", "check": True,
                                "settings": {"VLFLEET_PORT": "8000", "VLFLEET_CPUS": "0-1"}}, tmp_path)
    assert ok == {"changed": True, "release": "r1", "env_changes": {"VLFLEET_CPUS": {"from": None, "to": "0-1"},
                                                                    "VLFLEET_PORT": {"from": None, "to": "8000"}}}


# -- VLFLEET_* names nothing reads

def test_the_env_step_refuses_names_the_host_does_not_read_with_the_nearest(tmp_path):
    root, _ = _host(tmp_path, "VLFLEET_PORT=8000\n")
    args = {"root": str(root), "release": "r1", "check": True}
    with pytest.raises(HostError) as e:
        envfile.write_env({**args, "settings": {"VLFLEET_MAX_TOKEN": "64", "VLFLEET_CACHE": "/x", "OMP_X": "1"}})
    message = str(e.value)
    assert "VLFLEET_MAX_TOKEN is not a setting (did you mean VLFLEET_MAX_TOKENS?)" in message
    assert "VLFLEET_CACHE is not a setting" in message  # the controller's: it means nothing on a host
    assert "OMP_X" not in message and "vlm_service_extra_env" in message
    # `vlfleet rollout`: changes on top of the running release's env file are checked the same way
    with pytest.raises(HostError, match=r"VLFLEET_QUEUE_SIZ is not a setting \(did you mean "
                                                    r"VLFLEET_QUEUE_SIZE\?\)"):
        envfile.write_env({**args, "changes": {"VLFLEET_QUEUE_SIZ": "4"}})
    assert envfile.write_env({**args, "changes": {"VLFLEET_QUEUE_SIZE": "4"}})["changed"] is True


def test_the_service_refuses_to_start_on_a_name_nothing_reads():
    with pytest.raises(settings.SettingsError) as e:
        settings.load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_ENGNE": "serial", "VLFLEET_KV_CACHE_GIB": "4"})
    message = str(e.value)
    assert "VLFLEET_ENGNE is not a setting (did you mean VLFLEET_ENGINE?)" in message
    assert "VLFLEET_KV_CACHE_GIB is not a setting (did you mean VLFLEET_KV_CACHE_GB?)" in message
    # what the launcher, the controller's tools and the tests set is no mistake in a service's environment
    assert settings.load({"VLFLEET_MODEL_DIR": "/m", "VLFLEET_CPUS": "0-1", "VLFLEET_CACHE": "/c",
                          "VLFLEET_REQUIRE_ALL": "1", "OMP_NUM_THREADS": "2"}).model_dir == Path("/m")


def test_the_service_start_gate_names_the_misspelt_variable(tmp_path):
    """`python -m service` (what the launcher execs) exits before loading anything, naming the variable."""
    done = subprocess.run([sys.executable, "-m", "service"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "VLFLEET_MODEL_DIR": str(tmp_path), "VLFLEET_MAX_TOKENZ": "64"})
    assert done.returncode == 2, done.stderr
    assert "VLFLEET_MAX_TOKENZ is not a setting (did you mean VLFLEET_MAX_TOKENS?)" in done.stderr


def test_rollout_refuses_an_unknown_setting_before_touching_a_host():
    with pytest.raises(FleetError, match=r"--env: VLFLEET_WARMUPP is not a setting \(did you mean VLFLEET_WARMUP\?\)"):
        Release("r2", env={"VLFLEET_WARMUPP": "false"})
    assert Release("r2", env={"VLFLEET_WARMUP": "false"}).env == {"VLFLEET_WARMUP": "false"}


def test_every_vlfleet_name_in_the_tree_is_one_the_contract_knows():
    """A VLFLEET_* variable read anywhere (host side, controller, tests, CI) is declared: in FIELDS, the launcher's
    inputs or settings.TOOLING_ENV. An undeclared one would make the service refuse to start in a shell that sets
    it, and the agent refuse it in an env file."""
    known = set(contract.HOST_NAMES) | set(contract.TOOLING_NAMES)
    files = [p for top in ("service", "ops", "templates", "roles", "tests", "docs", ".ci")
             for p in sorted((REPO / top).rglob("*")) if p.is_file() and p.suffix not in (".png", ".pyc")]
    files += [REPO / "Makefile", REPO / "README.md", REPO / "inventory.example"]
    undeclared = {}
    for path in files:
        if path == Path(__file__).resolve():  # misspelt on purpose above
            continue
        for name in set(re.findall(r"VLFLEET_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace"))) - known:
            undeclared.setdefault(name, str(path.relative_to(REPO)))
    assert not undeclared, f"undeclared VLFLEET_* names (add them to service/runtime/settings.py): {undeclared}"

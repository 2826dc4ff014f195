"""Roles, playbooks and templates: ansible-lint (production profile), syntax check, and the templates rendered with
plain Jinja2 (as Fabric renders them) and checked by the tools that consume them (systemd-analyze, nginx -t)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import pytest
import yaml

from tests import nginx_site
from tests.prereq import require_tools

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def _render(name: str, **variables) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True)
    env.globals["lookup"] = _lookup
    return env.get_template(name).render(**variables)


def _lookup(plugin: str, term: str) -> str:
    """Ansible's lookup() as the templates use it: the values the `vlfleet` lookup gives (tested through ansible in
    test_lookup_plugin.py; importing ansible here would patch sys.intern under torch in the same process)."""
    from service.runtime import contract

    assert plugin == "vlfleet" and term in contract.FILES, (plugin, term)
    return getattr(contract, term)


UNIT_VARS = dict(
    vlm_service_name="vlfleet", vlm_service_user="vlfleet", vlm_service_group="vlfleet",
    vlm_service_root="/opt/vlfleet", vlm_service_limit_nofile=65535, vlm_service_memory_high_mb=2400,
    vlm_service_memory_max_mb=2700, vlm_service_restart_sec=5, vlm_service_start_limit_burst=5,
    vlm_service_start_limit_interval_sec=600, vlm_service_timeout_stop_sec=60,
)


def test_ansible_lint_production_profile():
    linter = BIN / "ansible-lint"
    if not linter.exists():
        pytest.fail("ansible-lint missing from the venv: install the test extra")
    done = subprocess.run([str(linter), "--profile", "production", "--offline", "--nocolor", "-f", "pep8",
                           "roles", "ops/playbooks"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_site_playbook_syntax():
    from ops.playbook import ansible_env

    done = subprocess.run([str(BIN / "ansible-playbook"), "--syntax-check", "-i", "inventory.example",
                           "ops/playbooks/site.yml"], cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_documented_in_argument_specs(role: str):
    # Each input is documented twice (defaults + argument_specs), the node_exporter habit.
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"].get("options", {})
    assert set(defaults) <= set(options), f"undocumented in argument_specs: {set(defaults) - set(options)}"
    for name, spec in options.items():
        assert name.startswith(role + "_"), f"{name} lacks the role prefix"
        assert spec.get("description"), f"{name} has no description"


def test_templates_need_only_plain_jinja2():
    # No Ansible-only filters (comment, to_json, bool, ...): Fabric renders the same files with plain jinja2.
    for path in (REPO / "templates").glob("*.j2"):
        env = jinja2.Environment()
        env.from_string(path.read_text())  # compiling fails on a filter plain jinja2 lacks
        assert "ansible_managed" not in path.read_text(), path.name


def test_unit_exposure_is_at_most_3():
    require_tools("systemd-analyze")
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout
    if int(re.search(r"systemd (\d+)", version).group(1)) < 250:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    unit_dir = Path(tempfile.mkdtemp(prefix="vlfleet-unit-"))
    try:
        (unit_dir / "vlfleet.service").write_text(_render("vlfleet.service.j2", **UNIT_VARS))
        done = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", "vlfleet.service"],
                              cwd=unit_dir, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(unit_dir)
    found = re.search(r"Overall exposure level for vlfleet.service: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= 3.0, done.stdout
    assert "MemoryDenyWriteExecute=yes" not in _render("vlfleet.service.j2", **UNIT_VARS)


def test_unit_carries_the_contract():
    unit = _render("vlfleet.service.j2", **UNIT_VARS)
    for line in ("LimitNOFILE=65535", "Restart=on-failure", "MemoryHigh=2400M", "MemoryMax=2700M",
                 "User=vlfleet", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "CacheDirectory=vlfleet", "ExecStart=/opt/vlfleet/current/venv/bin/python -m service.launcher"):
        assert line in unit.splitlines(), line


def test_unit_reads_the_tuned_engine_after_the_releases_env_file_and_optionally():
    from service.runtime.contract import ENGINE_ENV_FILE

    files = [line for line in _render("vlfleet.service.j2", **UNIT_VARS).splitlines()
             if line.startswith("EnvironmentFile=")]
    # later files win in systemd: the engine `vlfleet tune` chose beats the release's VLFLEET_ENGINE
    assert files == ["EnvironmentFile=/opt/vlfleet/current/vlfleet.env", f"EnvironmentFile=-{ENGINE_ENV_FILE}"]


@pytest.mark.parametrize("affinity", [True, False])
def test_nginx_site_is_valid_and_drains(tmp_path: Path, affinity: bool):
    require_tools("nginx")
    upstreams = [{"name": "c1", "address": "10.0.0.11", "port": 8000, "down": False},
                 {"name": "c2", "address": "10.0.0.12", "port": 8000, "down": True}]
    nginx = nginx_site.Nginx(tmp_path, upstreams, lb_listen_port=18080, lb_affinity=affinity)
    site = (tmp_path / "site.conf").read_text()
    # every upstream block (least_conn; with affinity also the key's ring and its spill) lists the drained host
    assert len(re.findall(r"server 10\.0\.0\.12:8000 .* down;", site)) == (3 if affinity else 1)
    assert not re.search(r"server 10\.0\.0\.11:8000 .* down;", site)
    assert "proxy_buffering off;" in site and "proxy_http_version 1.1;" in site
    done = nginx.test()
    assert done.returncode == 0, done.stderr


def test_site_names_the_env_settings_it_changes_from_the_running_release(tmp_path: Path):
    # The inventory decides the env file; a `vlfleet rollout --env` change it lacks is undone by `vlfleet site`,
    # and the warning right after the env step says which settings changed (none, or no `env_changes`: no warning).
    from ops.playbook import ansible_env

    tasks = yaml.safe_load((REPO / "roles" / "vlm_service" / "tasks" / "configure.yml").read_text())
    at = next(i for i, task in enumerate(tasks) if task.get("register") == "__vlm_service_env")
    warn = tasks[at + 1]
    assert "ansible.builtin.debug" in warn and warn["changed_when"] is False
    changes = {"VLFLEET_MAX_TOKENS": {"from": "256", "to": None}, "VLFLEET_QUEUE_SIZE": {"from": None, "to": "8"},
               "VLFLEET_HOST": {"from": "0.0.0.0", "to": "10.0.0.2"}}
    answers = [{"changed": True, "env_changes": changes}, {"changed": False, "env_changes": {}}, {"changed": False}]
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        task for answer in answers for task in (
            {"ansible.builtin.set_fact": {"__vlm_service_env": {"rc": 0, "stdout_lines": ["", json.dumps(answer)]}}},
            warn)]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml"], cwd=tmp_path,
                          env=ansible_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    msgs = [json.loads(m) for m in re.findall(r'^    "msg": (".*")$', done.stdout, re.M)]
    assert len(msgs) == 1 and msgs[0].startswith("WARNING: "), done.stdout
    listed = "VLFLEET_HOST: 0.0.0.0 -> 10.0.0.2; VLFLEET_MAX_TOKENS: 256 -> (unset); VLFLEET_QUEUE_SIZE: (unset) -> 8."
    assert listed in msgs[0]
    assert "vlm_service_extra_env" in msgs[0]
    assert done.stdout.count("skipping: [localhost]") == 2, done.stdout

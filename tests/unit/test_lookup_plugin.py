"""The roles' `vlfleet` lookup (ops/ansible_plugins/lookup/vlfleet.py), through a real `ansible` run (not imported
here: importing ansible patches sys.intern, which breaks torch in the same process): what it gives is the project's
own value, and a name it does not know is an error naming the ones it does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ops.fleet import host_program
from ops.playbook import ansible_env, ansible_playbook_binary
from service.runtime import contract

REPO = Path(__file__).resolve().parents[2]


def _lookup(*terms: str) -> subprocess.CompletedProcess:
    expr = "{{ [" + ", ".join(f"lookup('vlfleet', '{t}')" for t in terms) + "] | to_json }}"
    ansible = ansible_playbook_binary().replace("ansible-playbook", "ansible")
    return subprocess.run([ansible, "localhost", "-c", "local", "-o", "-m", "ansible.builtin.debug", "-a",
                           f"msg={expr}"], env=ansible_env(), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_it_gives_the_host_program_the_templates_and_the_contract():
    done = _lookup("host_program", "templates", *contract.FILES)
    assert done.returncode == 0, done.stdout + done.stderr
    msg = json.loads(done.stdout.split(" => ", 1)[1])["msg"]
    path, templates, *files = json.loads(msg) if isinstance(msg, str) else msg
    assert Path(path) == host_program.build().path and Path(path).is_file()
    assert Path(templates) == REPO / "templates" and (Path(templates) / "vlfleet.service.j2").is_file()
    assert files == [getattr(contract, name) for name in contract.FILES]


def test_an_unknown_name_is_refused_with_the_known_ones():
    done = _lookup("TUNED")
    assert done.returncode != 0
    assert "lookup('vlfleet', 'TUNED'): use host_program, templates, DEFAULT_ENGINE or one of" in done.stdout, \
        done.stdout + done.stderr

"""The roles' `vlfleet` lookup (ops/ansible_plugins/lookup/vlfleet.py): what it gives is the project's own value,
and a name it does not know is an error naming the ones it does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError

from ops.fleet import host_program
from service.runtime import contract

REPO = Path(__file__).resolve().parents[2]


def _lookup():
    spec = importlib.util.spec_from_file_location("vlfleet_lookup", REPO / "ops/ansible_plugins/lookup/vlfleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LookupModule()


def test_it_gives_the_host_program_the_templates_and_the_contract():
    path, templates, *files = _lookup().run(["host_program", "templates", *contract.FILES])
    assert Path(path) == host_program.build().path and Path(path).is_file()
    assert Path(templates) == REPO / "templates" and (Path(templates) / "vlfleet.service.j2").is_file()
    assert files == [getattr(contract, name) for name in contract.FILES]


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(AnsibleLookupError, match=r"lookup\('vlfleet', 'TUNED'\): use host_program, templates, "
                                                 r"DEFAULT_ENGINE or one of .*TUNED_FILE"):
        _lookup().run(["TUNED"])

"""`lookup('vlfleet', NAME)`: what the roles take from the project rather than write down again.

- host_program: the path of the host program's archive on the controller (ops/fleet/host_program.py builds it
  when its sources changed), which the roles run with ansible.builtin.script;
- templates: the repository's templates/ folder (the one home of the roles' templates);
- a name of service/runtime/contract.py's FILES (ENGINE_ENV_FILE, TUNED_FILE, CPU_PLAN_FILE, MODEL_CACHE_DIR,
  HOST_PROGRAM_DIR) or DEFAULT_ENGINE: its value.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: vlfleet
short_description: values the vlfleet roles take from the project (host program, templates, contract)
description: See the module docstring of ops/ansible_plugins/lookup/vlfleet.py.
options:
  _terms:
    description: host_program, templates, or a name of service/runtime/contract.py's FILES or DEFAULT_ENGINE
    required: true
"""

ROOT = Path(__file__).resolve().parents[3]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from ops.fleet import host_program
        from service.runtime import contract

        values = []
        for term in terms:
            if term == "host_program":
                values.append(str(host_program.build().path))
            elif term == "templates":
                values.append(str(ROOT / "templates"))
            elif term in (*contract.FILES, "DEFAULT_ENGINE"):
                values.append(getattr(contract, term))
            else:
                raise AnsibleLookupError(f"lookup('vlfleet', {term!r}): use host_program, templates, DEFAULT_ENGINE "
                                         f"or one of {', '.join(contract.FILES)}")
        return values

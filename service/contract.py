"""What the service and the fleet side must agree on, read from service/settings.py: the engine names and the
default engine (VLFLEET_ENGINE's field), and the VLFLEET_* names a host reads.

The controller imports it (`vlfleet tune`, `vlfleet rollout --env`, the bench). The host agent
(ops/fleet/host_agent.py) runs on hosts with the distribution's python3 and no service code (Ansible's `script`
sends the file, Fabric its source), so it carries these values as literals: the block ``agent_block()`` renders,
between ``BEGIN`` and ``END``. `python -m service.contract` prints the block; tests/unit/test_contract.py fails when
the agent's copy differs from it.

Standard library only (as service/settings.py).
"""

from __future__ import annotations

import sys
import textwrap

from service.settings import FIELDS, TOOLING_ENV, host_names

_ENGINE = next(f for f in FIELDS if f.name == "engine")

ENGINES: tuple[str, ...] = _ENGINE.choices or ()  # VLFLEET_ENGINE's choices, the default first
DEFAULT_ENGINE: str = _ENGINE.default
HOST_NAMES: tuple[str, ...] = host_names()  # what a host's env file may set
TOOLING_NAMES: tuple[str, ...] = TOOLING_ENV  # read on the controller only

BEGIN = "# -- contract: begin (generated from service/settings.py by `python -m service.contract`; do not edit)"
END = "# -- contract: end"


def _tuple(name: str, values: tuple[str, ...], comment: str) -> str:
    body = textwrap.fill(", ".join(f'"{v}"' for v in values) + ",", width=116, initial_indent="    ",
                         subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return f"# {comment}\n{name} = (\n{body}\n)\n"


def agent_block() -> str:
    """The host agent's copy of the contract, as Python source (lines within ruff's 120 columns)."""
    return (f"{BEGIN}\n"
            + _tuple("ENGINES", ENGINES, "VLFLEET_ENGINE's choices (service/settings.py), the default first")
            + f'DEFAULT_ENGINE = "{DEFAULT_ENGINE}"  # what the service runs when no env file sets VLFLEET_ENGINE\n'
            + _tuple("SETTING_NAMES", HOST_NAMES, "every VLFLEET_* name the host side reads (settings, launcher)")
            + f"{END}\n")


if __name__ == "__main__":
    sys.stdout.write(agent_block())

"""The host program's command line: `vlfleet-host.pyz COMMAND ARGS`, one JSON document out (the last stdout line).

Steps take one argument, a JSON object (base64-encoded, what Fabric sends, or as is when it starts with "{"), and
answer {"error": ...} with exit 1 when they cannot be done. The roles run the release steps one by one and read
`changed` from the answer; with `"check": true` a step that would change something says so and changes nothing
(Ansible's check mode). Probes take their arguments by position (probe.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from . import gate, lb, probe, release, status, tune
from .envfile import write_env
from .errors import HostError

STEPS = {
    # the release steps (the roles call these one by one; Fabric, the composites stage and activate)
    "venv": release.venv, "env": write_env, "switch": release.switch_step, "gate": gate.gate_step,
    "prune": release.prune, "stage": release.stage, "activate": gate.activate,
    # fleet operations
    "describe": release.describe, "place": release.place, "quiesce": gate.quiesce, "status": status.status, "lb": lb.lb,
    # `vlfleet tune`
    "tune_info": tune.tune_info, "set_engine": tune.set_engine, "peak": tune.peak, "write_record": tune.write_record,
}


def _answer(result: object, code: int = 0) -> int:
    print(json.dumps(result))
    return code


def _step(name: str, argv: list[str]) -> int:
    if len(argv) != 1:
        return _answer({"error": f"usage: {name} BASE64-JSON|JSON"}, 2)
    try:
        args = json.loads(argv[0] if argv[0].lstrip().startswith("{") else base64.b64decode(argv[0]))
        return _answer(STEPS[name](args))
    except HostError as e:
        return _answer({"error": str(e)}, 1)
    except subprocess.TimeoutExpired as e:
        return _answer({"error": f"{' '.join(map(str, e.cmd))[:80]} timed out after {e.timeout:.0f} s"}, 1)


def main(argv: list[str]) -> int:
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name in STEPS:
        return _step(name, rest)
    if name not in probe.COMMANDS:
        return _answer({"error": f"usage: vlfleet-host.pyz {{{','.join([*STEPS, *probe.COMMANDS])}}} ARGS"}, 2)
    try:
        result = probe.COMMANDS[name](rest)
    except (IndexError, ValueError):  # too few positional arguments, or one that is not a number
        return _answer({"error": f"usage: {name} ARGS (see ops/host/probe.py)"}, 2)
    return _answer(result)


def run() -> None:
    """The zipapp's entry point."""
    sys.exit(main(sys.argv[1:]))

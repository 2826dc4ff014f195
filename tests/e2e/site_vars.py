"""site.yml on e2e staging fleets: the extra variables every converge passes, and the one converge per inventory
that the modules needing a serving fleet share (site.yml on a TCG VM costs minutes even when nothing changes; each
module puts back what it breaks)."""

from __future__ import annotations

import os
from pathlib import Path

from ops.staging import converge_vars

CONVERGE_TIMEOUT = 1800  # bounded so a stuck VM cannot eat CI's 90 minutes
_converges: dict[Path, object] = {}


def site_vars(artifact: Path, python: str = "3.11") -> dict:
    """The standard fleet's variables: the tiny model as an OpenVINO artifact and as a GGUF artifact, with the
    llama.cpp runtime in the wheelhouse, so every engine can run on the hosts. The runtime is the suite's own
    build, tuned for this CPU: the tests run llamacpp on c1, a container of this machine (on a VM with an emulated
    CPU that lacks this one's ISA, the engine would refuse the build and name the fix)."""
    from ops.llamacpp import build, gguf, wheel

    config = build.test_config()
    runtime = wheel.runtime_wheel(build.build(config))
    return converge_vars.site_vars(artifact, python, gguf=gguf.cached("tiny", build_config=config),
                                   extra_wheels=[runtime])


def converge(inventory: Path, artifact: Path, echo=print):
    """site.yml on ``inventory``, once per session: its RunResult (None under VLFLEET_E2E_CONVERGED=1, the dev loop
    on a kept fleet that is already converged)."""
    from ops.playbook import host_python_versions, run_playbook

    if os.environ.get("VLFLEET_E2E_CONVERGED") == "1":
        return None
    if inventory not in _converges:
        python = min(host_python_versions(inventory).values())  # the wheelhouse for the hosts' Python
        run = run_playbook(inventory, "site.yml", site_vars(artifact, python), timeout=CONVERGE_TIMEOUT, echo=echo)
        assert run.ok, f"site.yml failed, no serving fleet to test:\n{run.summary()}"
        _converges[inventory] = run
    return _converges[inventory]

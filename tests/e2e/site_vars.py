"""site.yml on e2e staging fleets: the extra variables every converge passes, and the one converge per inventory
that the modules needing a serving fleet share (site.yml on a TCG VM costs minutes even when nothing changes; each
module puts back what it breaks)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def runtime_prefetched() -> Iterator[None]:
    """While the body runs, build site_vars()'s llama.cpp runtime in a child process when the cache lacks it.

    On a cold cache the build (about 6 min on 2 cores) used to start only at the first converge. It runs under nice
    19, so alongside the fleet coming up it takes only the CPU that the image build, downloads and boot waits
    leave; site_vars() then waits for it on the build's own lock (or, if it failed, builds and reports the error
    itself). A body that ends first stops the child's whole process group: a killed build leaves no build.json,
    so the next one starts over."""
    from ops.llamacpp import build

    config = build.test_config()
    if build.find(config) is not None:
        yield
        return
    child = multiprocessing.get_context("fork").Process(target=_build_in_own_group, args=(config,),
                                                        name="llamacpp-prefetch", daemon=True)
    child.start()
    try:
        yield
    finally:
        if child.is_alive():
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:  # stopped before it made its group: it has started no compiler yet
                child.terminate()
            child.join(30)


def _build_in_own_group(config) -> None:
    from ops.llamacpp import build

    os.setpgid(0, 0)  # the compilers it starts join this group, so one killpg stops them all
    build.build(config, say=lambda _msg: None)


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

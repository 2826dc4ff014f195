"""`vlfleet wheelhouse.*`: the host runtime as wheels, for hosts that reach no package index."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit, task


@task(help={
    "python": "the hosts' Python: 3.10 (Ubuntu 22.04, default) or 3.11 (Debian 12 staging hosts)",
    "platform": "the hosts' wheel platform (default manylinux_2_35_x86_64 = Ubuntu 22.04's glibc 2.35); "
                "older manylinux tags are included automatically",
    "out": "directory to put the wheelhouse in (default: printed path under the vlfleet cache)",
    "quiet": "hide pip's download progress",
    "llamacpp": "also put llama.cpp's llama-server in, for the llamacpp engine: portable (hosts of any x86-64 CPU) "
                "or native (this controller's CPU); a fleet that runs it needs it in every rollout's wheelhouse",
})
def build(c, python="3.10", platform=None, out=None, quiet=False, llamacpp=None):
    """Download the pinned host runtime (pyproject's host extra) + the project's wheel, hash-pinned."""
    from ops.llamacpp.build import BuildError
    from ops.llamacpp.source import SourceError
    from ops.llamacpp.wheel import WheelError, hosts_wheel
    from ops.wheelhouse import DEFAULT_PLATFORM, Target, WheelhouseError, assemble

    try:
        extra = [hosts_wheel(llamacpp)] if llamacpp else []
        path = assemble(Target(str(python), platform or DEFAULT_PLATFORM), Path(out) if out else None, quiet=quiet,
                        extra_wheels=extra)
    except (WheelhouseError, BuildError, SourceError, WheelError) as e:
        raise Exit(f"wheelhouse.build: {e}") from e
    size = sum(p.stat().st_size for p in path.glob("*.whl"))
    print(f"wheelhouse for Python {python}: {path} ({size / 1e6:.0f} MB)\n"
          f"install on a host: pip install --no-index --find-links {path} --require-hashes -r {path}/requirements.txt")

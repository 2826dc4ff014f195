"""site.yml's extra variables for a staging fleet, one definition for the e2e tests and `vlfleet staging.scale`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def site_vars(artifact: Path, python: str = "3.11", ready_timeout: int = 900, gguf: Path | None = None,
              extra_wheels: Sequence[Path] = ()) -> dict:
    """The artifact, a wheelhouse for the hosts' Python (Debian 12 staging hosts run 3.11), and the service bound
    to each host's fleet address, because the load balancer is another host. With ``gguf`` (and the llama.cpp
    runtime wheel among ``extra_wheels``) the hosts can run the llamacpp engine too."""
    from ops.wheelhouse import DEFAULT_PLATFORM, Target, assemble

    wheelhouse = assemble(Target(python, DEFAULT_PLATFORM), quiet=True, extra_wheels=extra_wheels)
    return {"vlfleet_artifact_dir": str(artifact), "vlfleet_wheelhouse_dir": str(wheelhouse),
            "vlm_service_host": "{{ ansible_host }}", "vlm_service_ready_timeout": ready_timeout,
            **({"vlfleet_gguf_dir": str(gguf)} if gguf else {})}

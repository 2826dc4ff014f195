"""site.yml's extra variables for a staging fleet, one definition for the e2e tests and `vlfleet staging.scale`."""

from __future__ import annotations

from pathlib import Path


def site_vars(artifact: Path, python: str = "3.11", ready_timeout: int = 900) -> dict:
    """The artifact, a wheelhouse for the hosts' Python (Debian 12 staging hosts run 3.11), and the service bound
    to each host's fleet address, because the load balancer is another host."""
    from ops.wheelhouse import DEFAULT_PLATFORM, Target, assemble

    return {"vlfleet_artifact_dir": str(artifact),
            "vlfleet_wheelhouse_dir": str(assemble(Target(python, DEFAULT_PLATFORM), quiet=True)),
            "vlm_service_host": "{{ ansible_host }}", "vlm_service_ready_timeout": ready_timeout}

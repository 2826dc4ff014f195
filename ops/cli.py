"""The `vlfleet` console script: a Fabric program whose task collection is the project's.

It behaves like `fab` (`vlfleet --list`, `vlfleet -H host1,host2 TASK`), without looking for a fabfile.
"""

from __future__ import annotations

from fabric import Config, Executor
from fabric.main import Fab

from ops.tasks import namespace


def make_program() -> Fab:
    return Fab(
        name="vlfleet",
        version="0.1.0",
        namespace=namespace(),
        executor_class=Executor,
        config_class=Config,
    )


def main() -> None:
    make_program().run()


"""`python -m ops.host COMMAND ARGS`: the host program from the source tree (tests, a developer's shell)."""

from .cli import run

run()

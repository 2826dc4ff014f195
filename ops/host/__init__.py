"""The host program: everything vlfleet does on a fleet host outside the service, as one stdlib-only package.

It is built into one file, `vlfleet-host-<digest>.pyz` (a zipapp of this folder, ops/fleet/host_program.py), that every
caller ships the same way and runs with a Python of the host: the distribution's python3 (release steps, snapshot,
facts) or the release venv's (the probes that import the runtime). Callers: Fabric (ops/fleet/transport.py: rollout,
status, tune; ops/report), the roles (`ansible.builtin.script` with the lookup `vlfleet_host_program`), and the
checklist (ops/preflight/test_checklist.py). `python -m ops.host COMMAND ARGS` runs it from the source tree. What each
module owns: docs/architecture.md, "The host program".

Standard library only, Python 3.10: nothing outside this folder is imported (tests/unit/test_import_layers.py).
"""

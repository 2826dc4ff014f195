"""Which side may import which (the import graph of tests/unit/test_import_cycles.py), so that a dependency that
would break where a module runs fails here first:

- the host side (service/) runs without the controller's code: it never imports ops/ (service.probe, a controller
  probe that issue 31 moves out of service/, is the one known exception);
- the engines never import the HTTP layer (requests reach them as Jobs);
- the programs that run on their own import the standard library only (the host agent, with a host's python3; the
  settings and contract, which the agent's copy is checked against), or numpy besides (the hybrid engine's llama.cpp
  child, which starts in well under a second).
"""

from __future__ import annotations

import ast
import sys

from tests.unit.test_import_cycles import ROOT, import_graph

KNOWN_SERVICE_TO_OPS = {"service.probe": {"ops", "ops.client"}}
HTTP = ("service.app", "service.webui", "service.openapi", "service.health", "service.sse", "service.streaming",
        "service.auth", "service.api_")
STANDALONE = {"ops/fleet/host_agent.py": set(), "service/settings.py": set(), "service/contract.py": {"service"},
              "service/engine/llama_worker.py": {"numpy"}}


def top_level_imports(path) -> set[str]:
    """The top-level packages a file imports anywhere in it (``from __future__`` aside)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            names.add(node.module.split(".")[0])
    return names


def test_the_host_side_never_imports_the_controller():
    found = {m: {t for t in targets if t == "ops" or t.startswith("ops.")}
             for m, targets in import_graph().items() if m.startswith("service")}
    found = {m: t for m, t in found.items() if t}
    assert found == KNOWN_SERVICE_TO_OPS, found


def test_the_engines_never_import_the_http_layer():
    found = {m: sorted(t for t in targets if t.startswith(HTTP))
             for m, targets in import_graph().items() if m.startswith("service.engine")}
    assert not {m: t for m, t in found.items() if t}, found


def test_the_standalone_programs_import_the_standard_library_only():
    for name, allowed in STANDALONE.items():
        extra = top_level_imports(ROOT / name) - set(sys.stdlib_module_names) - allowed
        assert not extra, f"{name} imports {sorted(extra)}"


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    program = tmp_path / "agent.py"
    program.write_text("import json\n\ndef f():\n    import requests.adapters\n    from yaml import safe_load\n")
    assert top_level_imports(program) - set(sys.stdlib_module_names) == {"requests", "yaml"}

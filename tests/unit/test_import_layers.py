"""Which side may import which (the import graph of tests/unit/test_import_cycles.py), so that a dependency that
would break where a module runs fails here first:

- the service (service/) runs without the controller's code: it never imports ops/;
- the service's layers point one way: service.http -> service.engine -> service.runtime; the engines never import
  the HTTP layer (requests reach them as Jobs), the runtime (settings, manifest, memory guard, metrics, logs)
  imports neither;
- the host program (ops/host/) imports nothing but the standard library and itself: it runs as one archive with a
  host's python3;
- the other programs that run on their own import the standard library only (the settings and contract, which the
  host program's copy is checked against), or numpy besides (the hybrid engine's llama.cpp child, which starts in
  well under a second);
- no module holds another program as a string (the way `python -c <source>` once shipped the host side): no exec,
  eval or compile of text, no string constant that is Python code.
"""

from __future__ import annotations

import ast
import sys

from tests.unit.test_import_cycles import ROOT, import_graph

HTTP = ("service.http",)
STANDALONE = {"service/runtime/settings.py": set(), "service/runtime/contract.py": {"service"},
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
    assert not {m: t for m, t in found.items() if t}, found


def test_the_runtime_imports_neither_the_engines_nor_the_http_layer():
    found = {m: sorted(t for t in targets if t.startswith(("service.engine", "service.http")))
             for m, targets in import_graph().items() if m.startswith("service.runtime")}
    assert len(found) > 5 and not {m: t for m, t in found.items() if t}, found


def test_the_engines_never_import_the_http_layer():
    found = {m: sorted(t for t in targets if t.startswith(HTTP))
             for m, targets in import_graph().items() if m.startswith("service.engine")}
    assert not {m: t for m, t in found.items() if t}, found


def test_the_standalone_programs_import_the_standard_library_only():
    for name, allowed in STANDALONE.items():
        extra = top_level_imports(ROOT / name) - set(sys.stdlib_module_names) - allowed
        assert not extra, f"{name} imports {sorted(extra)}"


def test_the_host_program_imports_the_standard_library_and_itself_only():
    files = sorted((ROOT / "ops" / "host").glob("*.py"))
    assert len(files) > 5
    for path in files:
        extra = top_level_imports(path) - set(sys.stdlib_module_names)
        assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}: the host program runs alone on a host"


HOST_PROGRAM_AS_LIBRARY = {"ops.host", "ops.host.client", "ops.host.layout", "ops.host.probe"}


def test_the_controller_uses_of_the_host_program_only_its_client_layout_and_probes():
    used = {t for m, targets in import_graph().items() if m.startswith("ops") and not m.startswith("ops.host")
            for t in targets if t == "ops.host" or t.startswith("ops.host.")}
    assert used <= HOST_PROGRAM_AS_LIBRARY, sorted(used - HOST_PROGRAM_AS_LIBRARY)


def programs_in_strings(path) -> list[str]:
    """Where a module runs text as code (exec/eval/compile of it) or keeps Python source in a string constant."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval",
                                                                                              "compile"):
            found.append(f"{path.name}:{node.lineno}: {node.func.id}()")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and ("\n" in node.value or ";" in node.value)):  # a program, not a phrase like "import of"
            try:
                code = ast.parse(node.value)
            except (SyntaxError, ValueError):
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef)) for n in ast.walk(code)):
                found.append(f"{path.name}:{node.lineno}: Python source in a string")
    return found


def test_no_module_holds_another_program_as_a_string():
    files = [p for top in ("ops", "service") for p in sorted((ROOT / top).rglob("*.py"))]
    assert not [hit for path in files for hit in programs_in_strings(path)]


def test_the_string_check_finds_shipped_source(tmp_path):
    program = tmp_path / "transport.py"
    program.write_text('"""doc: import os"""\nBOOT = "import base64,zlib;exec(zlib.decompress(x))"\n'
                       'def run(src):\n    exec(src)\n')
    assert [hit.split(": ", 1)[1] for hit in programs_in_strings(program)] == ["Python source in a string", "exec()"]


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    program = tmp_path / "agent.py"
    program.write_text("import json\n\ndef f():\n    import requests.adapters\n    from yaml import safe_load\n")
    assert top_level_imports(program) - set(sys.stdlib_module_names) == {"requests", "yaml"}


def test_nothing_the_suite_imports_imports_ansible():
    """Importing ansible patches sys.intern, after which torch fails to import in the same process (seen: three
    failures in a CI run after a test module imported ansible.errors). Ansible runs as its own process only."""
    files = [p for top in ("ops", "service", "tests") for p in sorted((ROOT / top).rglob("*.py"))
             if "ansible_plugins" not in p.parts]
    found = [str(p.relative_to(ROOT)) for p in files if "ansible" in top_level_imports(p)]
    assert not found, found

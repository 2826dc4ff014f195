"""No import cycles among the project's modules (service/ and ops/).

A cycle works only as long as nobody reorders imports or touches a name at import time; it also hides which
module depends on which. Every ``import``/``from`` statement counts, the ones inside functions included:
a lazy import is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "ops")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages (a package is its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module (``service.x.f`` -> ``service.x``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement loads: ``from a import b`` may load module ``a.b``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".")
        package = package[:len(package) - node.level + (1 if is_package else 0)]
        base = ".".join([*package, base] if base else package)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source."""
    modules = project_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, is_package):
                target = _known(name, modules)
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles met by a depth-first walk, each as a path back to its start: empty exactly when there are none."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        _walk(graph, start, [], done, found)
    return found


def _walk(graph: dict[str, set[str]], module: str, path: list[str], done: set[str], found: list[list[str]]) -> None:
    if module in path:
        found.append([*path[path.index(module):], module])
        return
    if module in done:
        return
    path.append(module)
    for target in sorted(graph.get(module, ())):
        _walk(graph, target, path, done, found)
    path.pop()
    done.add(module)


def test_the_checker_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_counts_function_level_and_relative_imports(tmp_path):
    (tmp_path / "service" / "pkg").mkdir(parents=True)
    (tmp_path / "ops").mkdir()
    for name in ("service/__init__.py", "service/pkg/__init__.py", "ops/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "service" / "pkg" / "a.py").write_text("def f():\n    from service.pkg import b\n")
    (tmp_path / "service" / "pkg" / "b.py").write_text("from .a import f\n")
    graph = import_graph(tmp_path)
    assert graph["service.pkg.a"] == {"service.pkg", "service.pkg.b"}
    assert graph["service.pkg.b"] == {"service.pkg.a"}
    assert ["service.pkg.a", "service.pkg.b", "service.pkg.a"] in cycles(graph)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)

"""src/ imports one way: no module imports, even lazily or for the type checker only, one that imports it back, and
no part (a top-level package or module of ``distrinews``) imports a part that imports it back.

Drawn, a loop is a circle and a part's loop an arrow back up: the callbacks and their modules, the calibration and
its figures, int8 and the ONNX modules, the option declarations and the runtimes they list, and the command line's
package and its subcommands each were one.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom, modules: set[str]) -> set[str]:
    """The ``distrinews`` modules a ``from ... import`` takes names from: the submodules it imports, and the module
    itself unless every name is a submodule (importing ``package.sub`` runs the package first, but the package is
    already being imported: that is not a loop)."""
    if node.level:
        base = importer.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - node.level + 1]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    submodules = {f"{module}.{alias.name}" for alias in node.names} & modules
    return submodules if len(submodules) == len(node.names) else {module, *submodules}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of src/ it imports anywhere (inside functions and ``if TYPE_CHECKING`` too)."""
    paths = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found.update(_resolve(name, path.name == "__init__.py", node, set(paths)))
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for after in sorted(graph.get(node, ())):
            if found := visit(after):
                return found
        path.pop()
        done.add(node)
        return None

    return next((c for node in sorted(graph) if (c := visit(node))), None)


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    # the walk sees an import at the top, one inside a function and one for the type checker only
    assert "distrinews.train.callbacks" in graph["distrinews.train.early_stopping"]
    assert "distrinews.train.metrics" in graph["distrinews.train.build"]
    assert "distrinews.train.build" in graph["distrinews.train.calibration"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_part_imports_a_part_that_imports_it_back():
    parts: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        # The package root hands names on from every part (lazily); the parts import only its version
        if module == "distrinews":
            continue
        parts.setdefault(_part(module), set()).update(_part(i) for i in imported if _part(i) != _part(module))
    assert _cycle(parts) is None, " -> ".join(_cycle(parts) or [])


def test_the_check_finds_a_loop():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None

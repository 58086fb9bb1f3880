"""train/ imports one way: no module of it imports, even lazily or for the type checker only, one that imports it back.

The callbacks once formed a cycle (train/callbacks.py built the callbacks, whose modules import it), and so did the
calibration and its figures; a drawing of the imports showed both as arrows back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "src" / "distrinews" / "train"


def _imports(path: Path) -> set[str]:
    """The train/ modules that ``path`` imports, anywhere in it (inside functions and ``if TYPE_CHECKING`` too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.update([node.module] if node.module else [a.name for a in node.names])
    return {name.split(".")[0] for name in names if (TRAIN / f"{name.split('.')[0]}.py").is_file()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            found = visit(imported)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found:
            return found
    return None


def test_the_training_modules_import_one_way():
    graph = {path.stem: _imports(path) - {path.stem} for path in TRAIN.glob("*.py") if path.stem != "__init__"}
    assert "callbacks" in graph["early_stopping"] and "build" in graph["trainer"]  # the walk sees the imports
    cycle = _cycle(graph)
    assert cycle is None, "an import cycle in train/: " + " -> ".join(cycle or [])

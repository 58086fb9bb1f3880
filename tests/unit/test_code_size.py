"""Functions and files in src/ stay short enough to read whole: no function over 60 lines, no file over 500."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "distrinews"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500

# Exceptions, each with its reason; none today.
ALLOWED: set[str] = set()


def functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method under ``node``, named by its dotted path (``Class.method``, ``outer.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def oversized() -> dict[str, int]:
    """``file`` or ``file:function`` -> its length in lines, for each one over its limit."""
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_FILE_LINES:
            found[name] = lines
        for qualname, node in functions(ast.parse(text, filename=str(path))):
            # lineno is the ``def`` line: decorators are not counted
            span = (node.end_lineno or node.lineno) - node.lineno + 1
            if span > MAX_FUNCTION_LINES:
                found[f"{name}:{qualname}"] = span
    return found


def test_no_function_over_60_lines_and_no_file_over_500_in_src():
    found = oversized()
    over = {name: lines for name, lines in found.items() if name not in ALLOWED}
    listing = "\n".join(f"  {name}: {lines} lines" for name, lines in sorted(over.items()))
    assert not over, f"over {MAX_FUNCTION_LINES} lines a function or {MAX_FILE_LINES} a file:\n{listing}"


def test_the_allowed_set_names_only_what_is_still_too_long():
    stale = ALLOWED - set(oversized())
    assert not stale, f"no longer over the limit, take them out of ALLOWED: {sorted(stale)}"

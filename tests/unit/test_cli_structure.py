"""The command line's import graph: ``cli/__init__.py`` registers the subcommands, so a subcommand that imported
back from the package would make a cycle; what they share lives in a module of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import distrinews.cli

PACKAGE_DIR = Path(distrinews.cli.__file__).resolve().parent
PACKAGE = "distrinews.cli"


def _module_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _is_submodule(name: str) -> bool:
    return (PACKAGE_DIR / f"{name}.py").is_file() or (PACKAGE_DIR / name / "__init__.py").is_file()


def _back_imports(relative: Path, text: str) -> list[str]:
    """Each ``file:line`` where the module at ``relative`` (under cli/) takes a name from ``distrinews.cli`` itself."""
    module = _module_name(relative)
    package = module if relative.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text, str(relative))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            targets = [(source, alias.name) for alias in node.names]
        else:
            continue
        for source, name in targets:
            from_package = source == PACKAGE and (name is None or not _is_submodule(name))
            if from_package or (source == "distrinews" and name == "cli"):
                found.append(f"cli/{relative}:{node.lineno} imports {name or source} from {source}")
    return found


def test_no_module_under_cli_imports_from_the_cli_package_itself():
    modules = [p for p in sorted(PACKAGE_DIR.rglob("*.py")) if p != PACKAGE_DIR / "__init__.py"]
    assert len(modules) > 10, "the walk found the subcommand modules"
    found = [line for p in modules for line in _back_imports(p.relative_to(PACKAGE_DIR), p.read_text())]
    assert not found, "\n".join(found)


def test_the_check_sees_each_way_of_importing_back():
    for relative, text in (
        ("serve.py", "from . import usage_error"),
        ("doctor/__init__.py", "from .. import Subparsers"),
        ("doctor/checks.py", "from .. import write_json"),
        ("serve.py", "from .. import cli"),
        ("serve.py", "from distrinews.cli import usage_error"),
        ("serve.py", "import distrinews.cli"),
    ):
        assert _back_imports(Path(relative), text), text
    assert not _back_imports(Path("serve.py"), "from . import train\nfrom .doctor import checks")

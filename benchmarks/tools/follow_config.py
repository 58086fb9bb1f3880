"""``python -m benchmarks.tools.follow_config [SRC]``: follow the training config from ``distrinews train``.

Reads the source (ast only, nothing imported) and walks the calls from the ``train`` command's entry
(``cli/train.py`` ``run``) that pass the ``TrainConfig`` object, or one of its sections (``config.data``,
``config.run``, ...), as an argument. A leaf value (``config.run.seed``) is not followed: it is a number,
no longer the config. A method called on an object that holds the config (``self.config``) is walked
too, but it is no entry: the config is not passed there.

It prints the files the config is passed into and the re-entries. A file that passes the config to
another file enters it (once, however many of its calls go there); each entry into a file after its
first is a re-entry: the reader, following the config, comes back to a file already read, from another
file. A measure of how far the config's readers are spread, not of correctness.

What it resolves: module functions (imported under any name, in the module or inside a function),
classes (their ``__init__``), class and static methods, methods on ``self``, on a typed parameter, on
a local made by a constructor or by a function whose return is annotated, and on ``self.attr`` typed
in the class. Calls through ``getattr``, callbacks held in lists and other dynamic dispatch are not
followed (the callbacks' events, for one).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "distrinews"
ENTRY = ("distrinews.cli.train", "run", "config")  # module, function, the local that holds the config
WHOLE, SECTION = "whole", "section"


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local name -> (module, symbol)


@dataclass(frozen=True)
class Func:
    module: str
    cls: str | None
    node: ast.FunctionDef

    @property
    def label(self) -> str:
        return f"{self.cls}.{self.node.name}" if self.cls else self.node.name


class Source:
    def __init__(self, src: Path):
        self.src = src
        self.modules: dict[str, Module] = {}
        for path in sorted((src / PACKAGE).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            tree = ast.parse(path.read_text(), str(path))
            self.modules[name] = Module(name, path, tree, package)
        for module in self.modules.values():
            self._index(module)
        self.sections = self._sections()

    def _index(self, m: Module) -> None:
        for node in m.tree.body:
            if isinstance(node, ast.FunctionDef):
                m.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                m.classes[node.name] = node
        package = m.name if m.is_package else m.name.rpartition(".")[0]
        for imp in ast.walk(m.tree):
            if isinstance(imp, ast.ImportFrom):
                base = imp.module or ""
                if imp.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - imp.level + 1] + ([imp.module] if imp.module else []))
                for alias in imp.names:
                    sub = f"{base}.{alias.name}"
                    target = (sub, None) if sub in self.modules else (base, alias.name)
                    m.imports[alias.asname or alias.name] = target
            elif isinstance(imp, ast.Import):
                for alias in imp.names:
                    if alias.asname and alias.name in self.modules:
                        m.imports[alias.asname] = (alias.name, None)

    def _sections(self) -> set[str]:
        """TrainConfig's fields that are sections (annotated with a ``...Config`` class)."""
        for m in self.modules.values():
            cls = m.classes.get("TrainConfig")
            if cls is not None:
                return {
                    s.target.id
                    for s in cls.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and isinstance(s.annotation, ast.Name)
                    and s.annotation.id.endswith("Config")
                }
        raise SystemExit("no TrainConfig class in the source")

    def symbol(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, def or class) that ``name`` names in ``module``, through re-exports."""
        m = self.modules.get(module)
        if m is None or depth > 8:
            return None
        if name in m.functions:
            return module, m.functions[name]
        if name in m.classes:
            return module, m.classes[name]
        if name in m.imports:
            target, symbol = m.imports[name]
            return self.symbol(target, symbol, depth + 1) if symbol else None
        return None

    def method(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> Func | None:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return Func(module, cls.name, node)
        for base in cls.bases:
            if isinstance(base, ast.Name) and depth < 8:
                found = self.symbol(module, base.id)
                if found and isinstance(found[1], ast.ClassDef):
                    return self.method(found[0], found[1], name, depth + 1)
        return None

    def class_of(self, module: str, annotation: ast.expr | None) -> tuple[str, ast.ClassDef] | None:
        """The class an annotation names (``X``, ``"X"``, ``X | None``)."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.BinOp):
            return self.class_of(module, annotation.left) or self.class_of(module, annotation.right)
        if isinstance(annotation, ast.Name):
            found = self.symbol(module, annotation.id)
            if found and isinstance(found[1], ast.ClassDef):
                return found[0], found[1]
        return None


def is_self(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


class Walk:
    """The calls that carry the config, from the entry, to a fixed point."""

    def __init__(self, source: Source):
        self.s = source
        self.held: dict[tuple[str, str], dict[str, str]] = {}  # class -> {attribute: kind} holding the config
        self.edges: set[tuple[str, str]] = set()  # (module, the module it hands the config to)
        self.seen: set[tuple[Func, frozenset[tuple[str, str]]]] = set()

    def run(self) -> None:
        module, name, local = ENTRY
        entry = Func(module, None, self.s.modules[module].functions[name])
        while True:
            before = {k: dict(v) for k, v in self.held.items()}
            self.seen.clear()
            self.expand(entry, {local: WHOLE})
            if self.held == before:
                return

    # what in a function holds the config
    def kind(self, f: Func, expr: ast.expr, names: dict[str, str]) -> str | None:
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        if isinstance(expr, ast.Attribute):
            if is_self(expr.value) and f.cls:
                return self.held.get((f.module, f.cls), {}).get(expr.attr)
            inner = self.kind(f, expr.value, names)
            if inner == WHOLE and expr.attr in self.s.sections:
                return SECTION
        return None

    def locals_of(self, f: Func, names: dict[str, str]) -> dict[str, str]:
        names = dict(names)
        for _ in range(3):
            for node in ast.walk(f.node):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self.bind(f, target, node.value, names)
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    self.bind(f, node.target, node.value, names)
        return names

    def bind(self, f: Func, target: ast.expr, value: ast.expr, names: dict[str, str]) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                self.bind(f, t, v, names)
            return
        kind = self.kind(f, value, names)
        if kind is None and isinstance(value, ast.Call):  # config = with_problem_type(config): still the config
            kind = next((self.kind(f, a, names) for a in value.args if self.kind(f, a, names) == WHOLE), None)
            if kind and not (isinstance(target, ast.Name) and names.get(target.id) == WHOLE):
                kind = None
        if kind is None:
            return
        if isinstance(target, ast.Name):
            names[target.id] = kind
        elif isinstance(target, ast.Attribute) and is_self(target.value) and f.cls:
            self.held.setdefault((f.module, f.cls), {})[target.attr] = kind

    # the types of what methods are called on
    def types_of(self, f: Func) -> dict[str, tuple[str, ast.ClassDef]]:
        types: dict[str, tuple[str, ast.ClassDef]] = {}
        args = f.node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            found = self.s.class_of(f.module, a.annotation)
            if found:
                types[a.arg] = found
        for node in ast.walk(f.node):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                found = self.returns(f, node.value)
                if found:
                    types[node.targets[0].id] = found
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                found = self.returns(f, node.context_expr)
                if found:
                    types[node.optional_vars.id] = found
        return types

    def returns(self, f: Func, value: ast.expr) -> tuple[str, ast.ClassDef] | None:
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
            return None
        found = self.s.symbol(f.module, value.func.id)
        if found is None:
            return None
        if isinstance(found[1], ast.ClassDef):
            return found[0], found[1]
        if isinstance(found[1], ast.FunctionDef):
            return self.s.class_of(found[0], found[1].returns)
        return None

    def attribute_types(self, module: str, cls: ast.ClassDef) -> dict[str, tuple[str, ast.ClassDef]]:
        types: dict[str, tuple[str, ast.ClassDef]] = {}
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            f = Func(module, cls.name, method)
            for node in ast.walk(method):
                target: ast.expr | None = None
                found: tuple[str, ast.ClassDef] | None = None
                if isinstance(node, ast.AnnAssign):
                    target, found = node.target, self.s.class_of(module, node.annotation)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, found = node.targets[0], self.returns(f, node.value)
                if found and isinstance(target, ast.Attribute) and is_self(target.value):
                    types[target.attr] = found
        return types

    # the calls
    def callee(self, f: Func, call: ast.Call, types: dict[str, tuple[str, ast.ClassDef]]) -> tuple[Func, int] | None:
        """The function a call runs and how many of its leading parameters are bound already (self, cls)."""
        fn = call.func
        if isinstance(fn, ast.Name):
            found = self.s.symbol(f.module, fn.id)
            if found and isinstance(found[1], ast.FunctionDef):
                return Func(found[0], None, found[1]), 0
            if found and isinstance(found[1], ast.ClassDef):
                init = self.s.method(found[0], found[1], "__init__")
                return (init, 1) if init else None
            return None
        if not isinstance(fn, ast.Attribute):
            return None
        owner = fn.value
        cls: tuple[str, ast.ClassDef] | None = None
        if isinstance(owner, ast.Name):
            if owner.id == "self" and f.cls:
                cls = f.module, self.s.modules[f.module].classes[f.cls]
            elif owner.id in types:
                cls = types[owner.id]
            elif owner.id in self.s.modules[f.module].imports:
                target, symbol = self.s.modules[f.module].imports[owner.id]
                if symbol is None:
                    found = self.s.symbol(target, fn.attr)
                    if found and isinstance(found[1], ast.FunctionDef):
                        return Func(found[0], None, found[1]), 0
                    return None
                found = self.s.symbol(target, symbol)
                if found and isinstance(found[1], ast.ClassDef):
                    method = self.s.method(found[0], found[1], fn.attr)
                    return (method, 1) if method else None  # Class.classmethod(...)
        elif isinstance(owner, ast.Attribute) and is_self(owner.value) and f.cls:
            mine = self.s.modules[f.module].classes.get(f.cls)
            if mine is not None:
                cls = self.attribute_types(f.module, mine).get(owner.attr)
        if cls is None:
            return None
        method = self.s.method(cls[0], cls[1], fn.attr)
        return (method, 1) if method else None

    def expand(self, f: Func, carried: dict[str, str]) -> None:
        key = (f, frozenset(carried.items()))
        if key in self.seen:
            return
        self.seen.add(key)
        names = self.locals_of(f, carried)
        types = self.types_of(f)
        for call in (n for n in ast.walk(f.node) if isinstance(n, ast.Call)):
            target = self.callee(f, call, types)
            if target is None:
                continue
            g, bound = target
            passed = self.passed(f, g, bound, call, names)
            holds = bool(g.cls and self.held.get((g.module, g.cls)))
            if not passed and not holds:
                continue
            if passed and g.module != f.module:  # a method of an object holding it: followed, not an entry
                self.edges.add((f.module, g.module))
            self.expand(g, passed)

    def passed(self, f: Func, g: Func, bound: int, call: ast.Call, names: dict[str, str]) -> dict[str, str]:
        params = [a.arg for a in [*g.node.args.posonlyargs, *g.node.args.args]][bound:]
        out: dict[str, str] = {}
        for param, arg in zip(params, call.args, strict=False):
            kind = self.kind(f, arg, names)
            if kind:
                out[param] = kind
        for kw in call.keywords:
            kind = self.kind(f, kw.value, names) if kw.arg else None
            if kind and kw.arg:
                out[kw.arg] = kind
        return out


def report(source: Source, walk: Walk) -> tuple[int, int]:
    entered = Counter(module for _, module in walk.edges)
    entered[ENTRY[0]] += 1  # the entry itself
    files, entries = len(entered), sum(entered.values())
    relative = {name: m.path.relative_to(source.src / PACKAGE) for name, m in source.modules.items()}
    print(f"following the config from {relative[ENTRY[0]]} {ENTRY[1]}() in {source.src}")
    for module, n in entered.most_common():
        callers = sorted(str(relative[f]) for f, g in walk.edges if g == module)
        print(f"  {n:3d}  {relative[module]}  <- {', '.join(callers) if callers else '(entry)'}")
    print(f"files entered: {files}; re-entries: {entries - files}")
    return files, entries - files


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.follow_config", description=__doc__)
    parser.add_argument("src", nargs="?", default=str(ROOT / "src"), help="the source root holding distrinews/")
    args = parser.parse_args()
    source = Source(Path(args.src))
    walk = Walk(source)
    walk.run()
    report(source, walk)


if __name__ == "__main__":
    main()

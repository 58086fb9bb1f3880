"""No file is unpickled in ``src/`` but through a door that runs no code: a static check on the syntax tree.

Every name is resolved through the file's imports and aliases (``from torch import load as L``, ``import
torch.serialization as s``, ``getattr(pickle, "loads")``, ``importlib.import_module("dill")``), and every way
Python has to turn a file's bytes into objects that may run code is refused:

- ``pickle``/``_pickle``/``dill``/``cloudpickle`` ``load``, ``loads``, ``Unpickler``; ``marshal.load(s)``;
  ``shelve``; ``joblib.load``; ``jsonpickle.decode``; ``pandas.read_pickle``; ``torch.jit.load`` and
  ``torch.package`` (code by design); torch's DCP conversions (``format_utils``);
- ``torch.load`` (and ``torch.serialization.load``) unless it says ``weights_only=True``, literally;
- ``numpy.load`` unless ``allow_pickle`` is absent or literally ``False``; ``yaml.load`` unless its ``Loader`` is
  a safe one, and yaml's unsafe and full loaders;
- ``torch.distributed.checkpoint.load`` unless it reads through ``SafeReader`` and ``SafeLoadPlanner``.

A restricted unpickler is allowed where it is one: a subclass of ``pickle.Unpickler`` that defines
``find_class`` (and of DCP's reader and planner that override the methods that unpickle), listed here by name so
that a new one is read by a person. Each spelling is shown caught on a source snippet. The files of
``src/`` that go through such a door are loaded for real with a planted pickle in test_pickle_refused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from conftest import ROOT

_PICKLERS = ("pickle", "_pickle", "cPickle", "dill", "cloudpickle")
# Always refused: each reads bytes into objects that may run code.
UNPICKLERS = {
    *(f"{m}.{f}" for m in _PICKLERS for f in ("load", "loads", "Unpickler")),
    "marshal.load",
    "marshal.loads",
    *(f"shelve.{f}" for f in ("open", "Shelf", "BsdDbShelf", "DbfilenameShelf")),
    "joblib.load",
    "jsonpickle.decode",
    "jsonpickle.unpickler",
    "pandas.read_pickle",
    "torch.jit.load",
    "torch.package.PackageImporter",
    "torch.distributed.checkpoint.format_utils.dcp_to_torch_save",
    "torch.distributed.checkpoint.format_utils.torch_save_to_dcp",
    "yaml.unsafe_load",
    "yaml.unsafe_load_all",
    "yaml.full_load",
    "yaml.full_load_all",
    "yaml.Loader",
    "yaml.UnsafeLoader",
    "yaml.FullLoader",
}
WEIGHTS_ONLY = {"torch.load", "torch.serialization.load"}  # with weights_only=True, literally
NUMPY = {"numpy.load", "numpy.lib.format.read_array"}  # without allow_pickle, or allow_pickle=False literally
YAML = {"yaml.load", "yaml.load_all"}  # with Loader= one of SAFE_YAML_LOADERS
SAFE_YAML_LOADERS = {f"yaml.{n}" for n in ("SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader")}
DCP_LOAD = {  # with storage_reader=SafeReader(...) and planner=SafeLoadPlanner(...)
    "torch.distributed.checkpoint.load",
    "torch.distributed.checkpoint.load_state_dict",
    "torch.distributed.checkpoint.state_dict_loader.load",
    "torch.distributed.checkpoint.state_dict_loader.load_state_dict",
}
# A base that unpickles, allowed only as the base of a class that overrides the methods that do.
RESTRICTED_BASES = {
    **{f"{m}.Unpickler": {"find_class"} for m in _PICKLERS},
    "torch.distributed.checkpoint.FileSystemReader": {"read_metadata"},
    "torch.distributed.checkpoint.filesystem.FileSystemReader": {"read_metadata"},
    "torch.distributed.checkpoint.DefaultLoadPlanner": {"load_bytes"},
    "torch.distributed.checkpoint.default_planner.DefaultLoadPlanner": {"load_bytes"},
}
DYNAMIC_IMPORTS = {"importlib.import_module", "__import__", "builtins.__import__"}
MODULES = {name.rsplit(".", 1)[0] for name in (*UNPICKLERS, *WEIGHTS_ONLY, *NUMPY, *YAML, *DCP_LOAD)}
# The restricted unpicklers of src/, each read by a person: file, class.
KNOWN_RESTRICTED = {
    ("distrinews/checkpoint/sharded_reader.py", "_MetadataUnpickler"),
    ("distrinews/checkpoint/sharded_reader.py", "SafeReader"),
    ("distrinews/checkpoint/sharded_reader.py", "SafeLoadPlanner"),
}


@dataclass(frozen=True)
class Site:
    line: int
    what: str


class UnpicklingSites(ast.NodeVisitor):
    """Every reference in one module to a way of unpickling that this check does not see made safe."""

    def __init__(self, tree: ast.Module):
        self.aliases: dict[str, str] = {}  # local name -> what it names, dotted
        self.sites: list[Site] = []
        self.restricted: list[str] = []  # classes allowed as restricted unpicklers
        self._checked: set[int] = set()  # id() of the expressions a checked call already judged
        for node in ast.walk(tree):  # imports anywhere in the file bind their names (a conservative merge)
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name == "*":
                        if node.module in MODULES or node.module.split(".")[0] in _PICKLERS:
                            self.sites.append(Site(node.lineno, f"from {node.module} import *"))
                        continue
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        self.visit(tree)

    def qualified(self, node: ast.AST) -> str | None:
        """What an expression names, dotted (``t.serialization.load`` -> ``torch.serialization.load``)."""
        if isinstance(node, ast.Name):
            name = self.aliases.get(node.id, node.id if node.id in ("__import__", "getattr") else None)
        elif isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            name = f"{base}.{node.attr}" if base else None
        elif (
            isinstance(node, ast.Call)  # importlib.import_module("pickle") / __import__("pickle")
            and self.qualified(node.func) in DYNAMIC_IMPORTS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            name = node.args[0].value
        else:
            return None
        return name

    def flag(self, node: ast.AST, what: str) -> None:
        self.sites.append(Site(getattr(node, "lineno", 0), what))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        defined = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for base in node.bases:
            name = self.qualified(base)
            if name in RESTRICTED_BASES and RESTRICTED_BASES[name] <= defined:
                self._checked.add(id(base))
                self.restricted.append(node.name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualified(node.func)
        if name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            target = self.qualified(node.args[0])
            if target and isinstance(node.args[1].value, str):
                self._judge(node, f"{target}.{node.args[1].value}")
        elif name in WEIGHTS_ONLY | NUMPY | YAML | DCP_LOAD:
            self._checked.add(id(node.func))
            if not self._safe_call(name, node):
                self.flag(node, f"{name} without {self._needs(name)}")
        elif name in DYNAMIC_IMPORTS and self.qualified(node) in MODULES:
            self.flag(node, f"{name}({self.qualified(node)!r})")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._judge(node, self.qualified(node))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not self._judge(node, self.qualified(node)):
            self.generic_visit(node)  # t.serialization.load is judged once, as a whole

    def _judge(self, node: ast.AST, name: str | None) -> bool:
        """Flag a reference to an unpickler (a call not made safe, or the function passed on); True when judged."""
        if id(node) in self._checked or not name:
            return False
        if name in UNPICKLERS or name in RESTRICTED_BASES:
            self.flag(node, name)
            return True
        if name in WEIGHTS_ONLY | NUMPY | YAML | DCP_LOAD:
            self.flag(node, f"{name} passed on or called without {self._needs(name)}")
            return True
        return False

    @staticmethod
    def _needs(name: str) -> str:
        if name in WEIGHTS_ONLY:
            return "weights_only=True"
        if name in NUMPY:
            return "allow_pickle=False"
        if name in YAML:
            return "a safe Loader"
        return "SafeReader and SafeLoadPlanner"

    def _safe_call(self, name: str, call: ast.Call) -> bool:
        keywords = {k.arg: k.value for k in call.keywords}
        if None in keywords:  # **kwargs could say anything
            return False
        if name in WEIGHTS_ONLY:
            value = keywords.get("weights_only")
            return isinstance(value, ast.Constant) and value.value is True
        if name in NUMPY:
            value = keywords.get("allow_pickle")
            positional = name == "numpy.load" and len(call.args) > 2  # load(file, mmap_mode, allow_pickle, ...)
            return not positional and (value is None or (isinstance(value, ast.Constant) and value.value is False))
        if name in YAML:
            loader = keywords.get("Loader") or (call.args[1] if len(call.args) > 1 else None)
            return loader is not None and self.qualified(loader) in SAFE_YAML_LOADERS
        reader, planner = keywords.get("storage_reader"), keywords.get("planner")
        return all(
            isinstance(v, ast.Call) and (self.qualified(v.func) or getattr(v.func, "id", "")).endswith(want)
            for v, want in ((reader, "SafeReader"), (planner, "SafeLoadPlanner"))
        )


def sites_in(source: str) -> list[Site]:
    return UnpicklingSites(ast.parse(source)).sites


def _src_files() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / "src").rglob("*.py")):
        yield path.relative_to(ROOT / "src").as_posix(), ast.parse(path.read_text(), str(path))


CAUGHT = {
    "torch.load": "import torch\ntorch.load(p)",
    "torch.load weights_only=False": "import torch\ntorch.load(p, weights_only=False)",
    "torch.load weights_only from a variable": "import torch\nsafe = True\ntorch.load(p, weights_only=safe)",
    "torch.load weights_only in **kwargs": "import torch\ntorch.load(p, **{'weights_only': True})",
    "from torch import load": "from torch import load\nload(p)",
    "from torch import load as alias": "from torch import load as read\nread(p)",
    "import torch as alias": "import torch as t\nt.load(p)",
    "torch.serialization.load": "import torch\ntorch.serialization.load(p)",
    "from torch.serialization import load": "from torch.serialization import load\nload(p)",
    "import torch.serialization as alias": "import torch.serialization as s\ns.load(p)",
    "from torch import serialization": "from torch import serialization\nserialization.load(p)",
    "torch.load passed on": "import functools, torch\nread = functools.partial(torch.load, weights_only=True)",
    "torch.load in a function": "def f(p):\n    import torch\n    return torch.load(p)",
    "getattr(torch, 'load')": "import torch\ngetattr(torch, 'load')(p)",
    "pickle.load": "import pickle\npickle.load(f)",
    "pickle.loads": "import pickle\npickle.loads(b)",
    "from pickle import loads": "from pickle import loads\nloads(b)",
    "from pickle import load as alias": "from pickle import load as read\nread(f)",
    "import pickle as alias": "import pickle as p\np.load(f)",
    "pickle.Unpickler": "import pickle\npickle.Unpickler(f).load()",
    "an Unpickler subclass without find_class": "import pickle\nclass U(pickle.Unpickler):\n    pass",
    "_pickle": "import _pickle\n_pickle.loads(b)",
    "getattr(pickle, 'loads')": "import pickle\ngetattr(pickle, 'loads')(b)",
    "importlib.import_module('pickle')": "import importlib\nimportlib.import_module('pickle').loads(b)",
    "__import__('pickle')": "__import__('pickle').loads(b)",
    "from pickle import *": "from pickle import *\nloads(b)",
    "dill": "import dill\ndill.load(f)",
    "cloudpickle": "import cloudpickle\ncloudpickle.loads(b)",
    "shelve": "import shelve\nshelve.open(path)",
    "marshal": "import marshal\nmarshal.loads(b)",
    "joblib": "import joblib\njoblib.load(path)",
    "from joblib import load": "from joblib import load\nload(path)",
    "jsonpickle": "import jsonpickle\njsonpickle.decode(text)",
    "pandas.read_pickle": "import pandas as pd\npd.read_pickle(path)",
    "numpy.load allow_pickle=True": "import numpy as np\nnp.load(path, allow_pickle=True)",
    "numpy.load allow_pickle positional": "import numpy as np\nnp.load(path, None, True)",
    "numpy.load allow_pickle from a variable": "import numpy\nnumpy.load(path, allow_pickle=flag)",
    "numpy read_array": "from numpy.lib.format import read_array\nread_array(f, allow_pickle=True)",
    "yaml.load without Loader": "import yaml\nyaml.load(text)",
    "yaml.load with yaml.Loader": "import yaml\nyaml.load(text, Loader=yaml.Loader)",
    "yaml.unsafe_load": "import yaml\nyaml.unsafe_load(text)",
    "torch.jit.load": "import torch\ntorch.jit.load(path)",
    "torch.package": "from torch.package import PackageImporter\nPackageImporter(path)",
    "dcp.load with torch's reader": "import torch.distributed.checkpoint as dcp\ndcp.load(state, checkpoint_id=path)",
    "dcp.load without the safe planner": (
        "import torch.distributed.checkpoint as dcp\ndcp.load(state, storage_reader=SafeReader(path))"
    ),
    "dcp_to_torch_save": (
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\ndcp_to_torch_save(a, b)"
    ),
    "FileSystemReader subclass keeping its metadata reader": (
        "from torch.distributed.checkpoint import FileSystemReader\nclass R(FileSystemReader):\n    pass"
    ),
}

SAFE = {
    "torch.load weights_only=True": "import torch\ntorch.load(p, weights_only=True, map_location='cpu')",
    "an alias, weights_only=True": "from torch import load as read\nread(p, weights_only=True)",
    "numpy.load": "import numpy as np\nnp.load(path)",
    "numpy.load allow_pickle=False": "import numpy as np\nnp.load(path, allow_pickle=False)",
    "yaml.safe_load": "import yaml\nyaml.safe_load(text)",
    "yaml.load SafeLoader": "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
    "pickle.dumps and its error": "import pickle\npickle.dumps(x)\nexcept_ = pickle.UnpicklingError",
    "a restricted unpickler": (
        "import pickle\nclass U(pickle.Unpickler):\n"
        "    def find_class(self, m, n):\n        raise pickle.UnpicklingError"
    ),
    "dcp.load through the safe reader": (
        "import torch.distributed.checkpoint as dcp\n"
        "dcp.load(state, storage_reader=SafeReader(d), planner=SafeLoadPlanner(), no_dist=True)"
    ),
    "a method named load": "class C:\n    def load(self):\n        return self.load()\nsafetensors_load(b)",
    "a local name load": "def load(p):\n    return p\nload(p)",
}


@pytest.mark.parametrize("source", CAUGHT.values(), ids=CAUGHT.keys())
def test_each_spelling_of_unpickling_is_caught(source):
    assert sites_in(source), "not caught"


@pytest.mark.parametrize("source", SAFE.values(), ids=SAFE.keys())
def test_the_safe_spellings_pass(source):
    assert not sites_in(source)


def test_nothing_in_src_unpickles_but_through_a_safe_door():
    sites, loads, restricted = [], 0, set()
    for name, tree in _src_files():
        found = UnpicklingSites(tree)
        sites += [f"src/{name}:{s.line}: {s.what}" for s in found.sites]
        restricted |= {(name, cls) for cls in found.restricted}
        loads += sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and found.qualified(n.func) in WEIGHTS_ONLY)
    assert loads >= 7, "the check must see the torch.load calls it guards"
    assert not sites, "unpickling that may run a file's code:\n" + "\n".join(sites)
    assert restricted == KNOWN_RESTRICTED, "a new restricted unpickler: read it, then list it in KNOWN_RESTRICTED"

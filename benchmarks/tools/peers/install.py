"""``python -m benchmarks.tools.peers install``: the peers' own virtualenv, never the project's.

The peers pull in dependencies of their own (Ray, BentoML's and Infinity's pins) that must not change the
environment the project is tested in, so they go into a virtualenv of their own, by default ``DEFAULT_VENV``
(outside the checkout). In order:

1. ``torch`` first, pinned to ``TORCH`` (a CPU build: an unpinned ``torch`` would let pip pick a CUDA build of
   several GB for a peer's sake);
2. in one resolution, the peers (``PEERS``) and what the project's model code needs (``model_requirements``: its
   dependencies and its ``onnx`` extra, read from ``pyproject.toml``);
3. this repository, editable and without dependencies, so that every peer script loads the model and the tokenizer
   with the project's own code (``serve_model.py``; the runner puts the checkout it runs from first on the peers'
   ``PYTHONPATH``). Not its ``serve`` extra: the peers never run our server, and its uvicorn bound cannot hold
   beside Infinity's (uvicorn < 0.33).

Then ``pip freeze`` of the venv goes to ``DIR/peers-freeze.txt`` (the runner records the freeze of the interpreter it
runs the peers with in its JSON).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from pathlib import Path

from ..common import ROOT

DEFAULT_VENV = Path("/work/peers-venv")
TORCH = "torch==2.13.0"
# What each peer is installed with. Infinity without its ``optimum`` extra: its ONNX engine cannot load a local
# graph with optimum 2, and optimum 1 cannot be imported beside torch 2.13, so Infinity runs its torch engine
# (serve_infinity.py says more). Its other bounds: 0.0.77 imports huggingface_hub's HfFolder (gone in
# huggingface_hub 1, which transformers 5 requires), and it asks for numpy < 2.
PEERS = {
    "litserve": ["litserve"],
    "rayserve": ["ray[serve]"],
    "bentoml": ["bentoml"],
    "infinity": ["infinity-emb[server]", "transformers<5", "huggingface-hub<1", "numpy<2"],
}
MODEL_EXTRAS = ("onnx",)  # the project's extras the peer scripts' model code needs
FREEZE = "peers-freeze.txt"


def venv_python(directory: Path) -> Path:
    return directory / "bin" / "python"


def model_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's own dependencies and those of ``MODEL_EXTRAS``, as its ``pyproject.toml`` declares them."""
    import importlib

    # tomllib is the standard library's from Python 3.11; before it, pip's vendored tomli is the same module
    tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "pip._vendor.tomli")
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *(r for extra in MODEL_EXTRAS for r in project["optional-dependencies"][extra])]


def pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install(directory: Path, peers: list[str]) -> Path:
    """Make (or add to) the venv at ``directory`` with ``peers`` installed; returns its ``pip freeze`` file."""
    python = venv_python(directory)
    if not python.exists():
        venv.EnvBuilder(with_pip=True, symlinks=True).create(directory)
    pip(python, TORCH)
    # One resolution for the rest, the torch pin again: a peer that asks for another torch fails here rather than
    # replacing it, and no later install undoes a peer's bound (numpy < 2, transformers < 5).
    pip(python, TORCH, *model_requirements(), *[package for name in peers for package in PEERS[name]])
    pip(python, "--no-deps", "-e", str(ROOT))
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    out = directory / FREEZE
    out.write_text(frozen)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"the virtualenv (default: {DEFAULT_VENV})")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated (default: {','.join(PEERS)})")


def run(args: argparse.Namespace) -> int:
    peers = [p for p in args.peers.split(",") if p]
    if unknown := [p for p in peers if p not in PEERS]:
        print(f"install: unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2
    print(f"installed; versions in {install(args.venv.resolve(), peers)}")
    return 0

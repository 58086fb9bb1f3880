"""``export_space``: write the Space folder for a servable checkpoint (its layout: the package docstring).

The folder is built beside ``output`` and moved into place when complete, after its own checks pass (``check_bundle``:
the README's front matter, deploy/Dockerfile's invariants, CPU-only pins, the files the CMD names; the tests run them
too); an earlier bundle there is replaced but its ``.git`` kept (the user may have pushed it with git); any other
non-empty folder is refused.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from ...checkpoint.records import SERVABLE_INFO, ServableInfo, describe, read_servable_info
from ...checkpoint.versioning import is_version, version_fields
from ...config import ConfigError
from ...predict.int8 import METRIC_NAMES, TOLERANCE_POINTS
from . import DEFAULT_SPACE_RUNTIME, MODEL_DIR, MODEL_FILES, SPACE_RUNTIMES, accuracy, dockerfile, readme, requirements

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # .../distrinews
PACKAGE = PACKAGE_ROOT.name
# The modules the server runs from, per runtime; everything they import at module level comes with them,
# and so does every module of the server's own package (serve/) that they import inside a function: the
# server defers its own parts to start faster, not because they are optional. Other packages' lazy imports
# are runtime-specific (the torch runtime's loader, the int8 maker) and come only as a runtime's roots; the
# app imports its predictor inside a function, so the runtimes module is a root.
SERVER_ROOTS = ("serve/__main__.py", "predict/runtimes.py")
LAZY_FOLLOWED = f"{PACKAGE}.serve"
RUNTIME_ROOTS = {"onnx-int8": (), "onnx": (), "torch": ("checkpoint/servable.py",)}
STATIC_FILES = ("serve/static/index.html",)
# The tokenizer and config files a slim ONNX server reads; the torch runtime takes the whole folder.
ONNX_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
NOT_COPIED = (".onnx", ".pt", ".md")  # earlier exports and the model card (the Space README carries it)
GITATTRIBUTES = "".join(
    f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n" for ext in ("onnx", "safetensors", "bin", "pt")
)
DOCKERIGNORE = ".git\n**/__pycache__\n"
# A local torch wheel (.whl/, staged by `make space-image-test`) is build input, never Space content.
GITIGNORE = ".whl/\n__pycache__/\n"


# ------------------------------------------------------------------ the code
def _module_file(dotted: str) -> Path | None:
    """``distrinews.serve.app`` -> its file under PACKAGE_ROOT (a package's __init__.py), or None if not ours."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports_followed(path: Path) -> list[str]:
    """Our modules that ``path`` imports when imported, and the server modules it imports later (in a function)."""
    package = list(path.relative_to(PACKAGE_ROOT.parent).parts[:-1])  # a module's package; an __init__'s own
    found: list[str] = []

    def walk(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - (child.level - 1)] if child.level else []
                module = ".".join([*base, *(child.module.split(".") if child.module else [])])
                names = [module, *(f"{module}.{alias.name}" for alias in child.names)]  # submodules imported by name
            found.extend(n for n in names if not lazy or n == LAZY_FOLLOWED or n.startswith(LAZY_FOLLOWED + "."))
            walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))

    walk(ast.parse(path.read_text()), lazy=False)
    return found


def server_files(runtime: str) -> list[Path]:
    """Every file of this package the bundle's server needs, relative to the package's parent."""
    todo = [PACKAGE_ROOT / r for r in (*SERVER_ROOTS, *RUNTIME_ROOTS[runtime])]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        # Importing a module imports every package above it.
        inits = (PACKAGE_ROOT / parent / "__init__.py" for parent in path.relative_to(PACKAGE_ROOT).parents)
        todo += [init for init in inits if init.is_file()]
        todo += [target for dotted in _imports_followed(path) if (target := _module_file(dotted)) is not None]
    files = sorted(p.relative_to(PACKAGE_ROOT.parent) for p in seen)
    return files + [Path(PACKAGE) / s for s in STATIC_FILES]


# ------------------------------------------------------------------ the folder
REQUIRED_MODEL_FILES = ("config.json", "distrinews.json", "tokenizer.json")


def runtime_of(bundle: Path) -> str | None:
    """The runtime the bundle's model file implies (smallest first)."""
    for runtime in SPACE_RUNTIMES:
        if (bundle / MODEL_DIR / MODEL_FILES[runtime]).is_file():
            return runtime
    return None


def check_bundle(bundle: str | Path) -> list[str]:
    """Every problem found, as a sentence naming the file; empty for a bundle ready to push."""
    bundle = Path(bundle)
    runtime = runtime_of(bundle)
    if runtime is None:
        return [f"{bundle / MODEL_DIR}: no model file ({', '.join(MODEL_FILES.values())})"]
    required = [bundle / n for n in ("README.md", "Dockerfile", "requirements.txt", "distrinews/serve/__main__.py")]
    required += [bundle / MODEL_DIR / name for name in REQUIRED_MODEL_FILES]
    found = [f"{path} is missing" for path in required if not path.is_file()]
    if found:  # the checks below read these files
        return found
    found += readme.problems((bundle / "README.md").read_text())
    text, pins = (bundle / "Dockerfile").read_text(), (bundle / "requirements.txt").read_text()
    found += [f"Dockerfile: {p}" for p in dockerfile.problems(text, runtime)]
    found += [f"requirements.txt: {p}" for p in requirements.problems(pins, runtime)]
    argv = dockerfile.cmd_argv(text) or []
    for flag in ("--checkpoint", "--onnx-model"):
        if flag in argv and argv.index(flag) + 1 < len(argv) and not (bundle / argv[argv.index(flag) + 1]).exists():
            found.append(f"Dockerfile: CMD's {flag} {argv[argv.index(flag) + 1]} is not in the bundle")
    return found


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file, not a directory")
    earlier = (output / "Dockerfile").is_file() and (output / PACKAGE / "serve" / "__main__.py").is_file()
    if output.is_dir() and any(p.name != ".git" for p in output.iterdir()) and not earlier:
        raise ConfigError(
            f"--output {output} is not empty and holds no earlier Space bundle; choose a new or empty directory"
        )


def _publish(staging: Path, output: Path) -> None:
    """Move the finished folder into place; an earlier bundle there is replaced, its .git kept."""
    if not output.exists():
        os.replace(staging, output)
        return
    for p in output.iterdir():
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in staging.iterdir():
        os.replace(p, output / p.name)
    staging.rmdir()


def _read_checkpoint(checkpoint: Path) -> ServableInfo:
    found = describe(checkpoint)
    if found is None or not found.servable:
        raise ConfigError(
            f"--checkpoint {checkpoint}: export --format space needs a servable checkpoint directory "
            "(runs/NAME/best, with config.json and distrinews.json)"
        )
    if not (checkpoint / "tokenizer.json").is_file():
        raise ConfigError(
            f"--checkpoint {checkpoint}: no tokenizer.json (a fast tokenizer's file), which the Space's server reads"
        )
    return read_servable_info(checkpoint)


def _torch_version() -> str:
    return metadata.version("torch").split("+", 1)[0]


def export_space(
    checkpoint: str | os.PathLike[str],
    output: str | os.PathLike[str],
    runtime: str = DEFAULT_SPACE_RUNTIME,
    version: str | None = None,
    check_accuracy: bool = False,
    data_dir: str | None = None,
    repo_id: str | None = None,
    base_image: str | None = None,
    say: Callable[[str], Any] = print,
) -> Path:
    """Write the Space folder for ``checkpoint`` into ``output`` and return it (raises ConfigError for bad input)."""
    checkpoint, output = Path(checkpoint), Path(output)
    if runtime not in SPACE_RUNTIMES:
        raise ConfigError(f"--runtime {runtime!r}: choose one of {', '.join(SPACE_RUNTIMES)}")
    if version is not None and not is_version(version):
        raise ConfigError(f"--version {version!r}: must be MAJOR.MINOR.PATCH, e.g. 1.0.0")
    if check_accuracy and runtime != "onnx-int8":
        raise ConfigError("--check-accuracy compares int8 with fp32: it applies to --runtime onnx-int8 only")
    info = _read_checkpoint(checkpoint)
    _check_output(output)
    info = replace(info, **version_fields(info.training_config, version or info.model_version))
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{output.name}-", dir=output.parent))
    try:
        check = _write_model(checkpoint, staging / MODEL_DIR, runtime, check_accuracy, data_dir, say)
        export = {
            "runtime": runtime,
            "model_file": f"{MODEL_DIR}/{MODEL_FILES[runtime]}",
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "int8_accuracy_check": check,
        }
        info = replace(info, extra={**info.extra, "export": export})
        payload = info.to_json()
        if payload["config_hash"] is None:  # weights from no training run: the bundle names no hash
            del payload["config_hash"]
        (staging / MODEL_DIR / SERVABLE_INFO).write_text(json.dumps(payload, indent=2))
        for rel in server_files(runtime):
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PACKAGE_ROOT.parent / rel, staging / rel)
        (staging / "requirements.txt").write_text(requirements.render(runtime))
        torch_version = _torch_version() if runtime == "torch" else None
        (staging / "Dockerfile").write_text(dockerfile.render(runtime, torch_version, base_image))
        (staging / "README.md").write_text(readme.render(info, runtime, accuracy.note(runtime, check), repo_id))
        (staging / ".gitattributes").write_text(GITATTRIBUTES)
        (staging / ".dockerignore").write_text(DOCKERIGNORE)
        (staging / ".gitignore").write_text(GITIGNORE)
        problems = check_bundle(staging)
        if problems:  # a bug in this module, not the user's input: say exactly what
            raise RuntimeError("the Space bundle fails its own checks: " + "; ".join(problems))
        _publish(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def _write_model(
    checkpoint: Path,
    model_dir: Path,
    runtime: str,
    check_accuracy: bool,
    data_dir: str | None,
    say: Callable[[str], Any],
) -> dict[str, Any] | None:
    """The runtime's model files into ``model_dir``; for int8 with ``check_accuracy``, the comparison with fp32."""
    model_dir.mkdir(parents=True)
    if runtime == "torch":
        for p in checkpoint.iterdir():
            if p.is_file() and not p.name.endswith(NOT_COPIED):
                shutil.copyfile(p, model_dir / p.name)
        return None
    for name in ONNX_MODEL_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, model_dir / name)
    from ...predict.onnx import quantize_int8
    from ..onnx import export_onnx

    with tempfile.TemporaryDirectory(prefix="distrinews-space-") as tmp:
        say(f"exporting {checkpoint} to ONNX (fp32, checked against PyTorch)")
        fp32 = export_onnx(checkpoint, Path(tmp) / "model.onnx")
        if runtime == "onnx":
            shutil.move(str(fp32), model_dir / MODEL_FILES["onnx"])
            return None
        int8 = quantize_int8(fp32, model_dir / MODEL_FILES["onnx-int8"])
        if not check_accuracy:
            return None
        say("measuring int8 against fp32 on the model's evaluation rows (--check-accuracy)")
        result = accuracy.compare_int8(checkpoint, fp32, int8, data_dir)
        metric = METRIC_NAMES[result["metric"]]
        fp32_score, int8_score = accuracy.scores(result)
        say(
            f"int8 {metric} {100 * int8_score:.2f}% vs fp32 {100 * fp32_score:.2f}% "
            f"on {result['rows']:,} rows of {result['source']} ({result['difference_points']:+.2f} points)"
        )
        if not result["within_tolerance"]:
            raise ConfigError(
                f"int8 loses {-result['difference_points']:.2f} {metric} points against fp32 (tolerance "
                f"{TOLERANCE_POINTS}); export with --runtime onnx (fp32) instead"
            )
        return result

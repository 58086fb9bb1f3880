"""A bundle's own checks: what must hold before it is pushed (run by the export, and by the tests).

The README's front matter configures a Docker Space; the Dockerfile keeps deploy/Dockerfile's
invariants; requirements.txt pins CPU-only serving packages; the files the CMD names exist.
"""

from __future__ import annotations

from pathlib import Path

from . import MODEL_DIR, MODEL_FILES, SPACE_RUNTIMES, dockerfile, readme, requirements

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
    found: list[str] = []
    runtime = runtime_of(bundle)
    if runtime is None:
        return [f"{bundle / MODEL_DIR}: no model file ({', '.join(MODEL_FILES.values())})"]
    for name in ("README.md", "Dockerfile", "requirements.txt", "distrinews/serve/__main__.py"):
        if not (bundle / name).is_file():
            found.append(f"{bundle / name} is missing")
    for name in REQUIRED_MODEL_FILES:
        if not (bundle / MODEL_DIR / name).is_file():
            found.append(f"{bundle / MODEL_DIR / name} is missing")
    if found:
        return found
    found += readme.problems((bundle / "README.md").read_text())
    text = (bundle / "Dockerfile").read_text()
    found += [f"Dockerfile: {p}" for p in dockerfile.problems(text, runtime)]
    found += [
        f"requirements.txt: {p}" for p in requirements.problems((bundle / "requirements.txt").read_text(), runtime)
    ]
    argv = dockerfile.cmd_argv(text) or []
    for flag in ("--checkpoint", "--onnx-model"):
        if flag in argv and argv.index(flag) + 1 < len(argv) and not (bundle / argv[argv.index(flag) + 1]).exists():
            found.append(f"Dockerfile: CMD's {flag} {argv[argv.index(flag) + 1]} is not in the bundle")
    return found

"""Writes deploy/requirements.txt, what the serving image (deploy/Dockerfile) installs after torch: every package
pinned to the version installed where this runs, which is the environment the tests passed in.

    python deploy/lock-requirements.py          # from a checkout's root, in the dev environment (make setup)
    python deploy/lock-requirements.py --check  # the lock agrees with pyproject.toml (exit 1 and why if not)

The image's own dependencies are pyproject.toml's: the package's, without torch (its CPU build is the Dockerfile's
step of its own), and those of its ``serve`` and ``onnx`` extras; the lock adds everything they and torch need on
the image's platform (Linux, this Python), so a rebuild installs the same packages. tests/unit/test_image_lock.py
checks the file against pyproject.toml's ranges.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib  # Python 3.11+, as the image and the dev environment
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "deploy" / "requirements.txt"
EXTRAS = ("serve", "onnx")  # the image serves (with every runtime) and quantizes ONNX at start
TORCH = "torch"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.!+_-]+)")


def image_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """pyproject.toml's requirements that the image installs from deploy/requirements.txt (torch is not one)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in EXTRAS for r in project["optional-dependencies"][extra])]
    return [r for r in map(Requirement, declared) if canonicalize_name(r.name) != TORCH]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """Every distribution ``roots`` need here, transitively, by canonical name: its installed version."""
    found: dict[str, str] = {}
    todo = [(r, "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"{req.name} is not installed here: run this in the dev environment (make setup)"
            ) from None
        if name not in found:
            found[name] = dist.version
            todo += [(Requirement(r), "") for r in dist.requires or []]
        for wanted in req.extras:  # uvicorn[standard] and the like: what the extra adds
            todo += [(Requirement(r), wanted) for r in dist.requires or [] if "extra" in r]
    return found


def render() -> str:
    roots = image_requirements()
    pins = closure([*roots, Requirement(TORCH)])
    pins.pop(TORCH)
    direct = {canonicalize_name(r.name) for r in roots}
    python = ".".join(map(str, sys.version_info[:2]))
    lines = [
        "# What deploy/Dockerfile installs after torch, every package pinned: written by deploy/lock-requirements.py",
        f"# (Python {python}, Linux) from the versions the tests passed with; do not edit by hand. The image's",
        "# own dependencies (pyproject.toml's, without torch, with the serve and onnx extras) are marked; the rest",
        "# are theirs and torch's. tests/unit/test_image_lock.py checks each pin against pyproject.toml's range.",
    ]
    for name, version in sorted(pins.items()):
        lines.append(f"{name}=={version}" + ("  # pyproject.toml" if name in direct else ""))
    return "\n".join(lines) + "\n"


def pins(text: str) -> tuple[dict[str, str], list[str]]:
    """The lock's pins (canonical name: version) and its lines that are not ``name==version``."""
    found, bad = {}, []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.fullmatch(line)
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
        else:
            bad.append(line)
    return found, bad


def problems(text: str, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What makes the lock ``text`` disagree with pyproject.toml: a line that is not an exact pin, torch or a GPU
    build, an image dependency unpinned or pinned outside its range, and (where the version pinned is the one
    installed here, whose metadata says) a dependency of a pinned package unpinned or out of its range."""
    found, bad = pins(text)
    out = [f"{line!r} is not an exact pin (name==version)" for line in bad]
    out += [f"{n}=={v}: torch and GPU builds are not in the lock" for n, v in found.items() if _gpu_or_torch(n, v)]
    for req in image_requirements(pyproject):
        out += _check(req, found, "pyproject.toml")
    for name, version in found.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue  # another version here: its requirements are not this one's
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({**default_environment(), "extra": ""}):
                out += _check(req, found, f"{name} {version}")
    return out


def _check(req: Requirement, found: dict[str, str], by: str) -> list[str]:
    name = canonicalize_name(req.name)
    if name == TORCH:
        return []
    if name not in found:
        return [f"{req} ({by}) is not pinned"]
    if not req.specifier.contains(found[name], prereleases=True):
        return [f"{name}=={found[name]} is outside {req} ({by})"]
    return []


def _gpu_or_torch(name: str, version: str) -> bool:
    return (
        name in (TORCH, "torchvision", "torchaudio", "triton")
        or name.startswith(("nvidia-", "cuda-"))
        or ("+cu" in version)
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        found = problems(LOCK.read_text())
        print("\n".join(found) or f"{LOCK.relative_to(ROOT)} agrees with pyproject.toml")
        raise SystemExit(1 if found else 0)
    text = render()
    LOCK.write_text(text)
    print(f"{LOCK.relative_to(ROOT)}: {len(re.findall(r'==', text))} packages pinned")

"""The torch floor is declared once, in pyproject.toml, and every pinned torch elsewhere (the Makefile's venv, the
serving image, the install page, the Space bundle's Dockerfile) stands at or above it. Below 2.6,
``torch.load(weights_only=True)`` can be made to run code (CVE-2025-32434), and every checkpoint read relies on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS_ONLY_HOLDS = Version("2.6")  # CVE-2025-32434 was fixed in 2.6.0
# Where a torch version is pinned, and the pattern that finds each pin.
PINS = {
    "Makefile": r"TORCH_VERSION:-([\d.]+)\}|TORCH_VERSION \?= ([\d.]+)",
    "deploy/Dockerfile": r"ARG TORCH_VERSION=([\d.]+)",
    "deploy/build-image.sh": r"TORCH_VERSION:-([\d.]+)\}",
    "docs/index.md": r"pip install torch==([\d.]+)",
}
# Where a second floor must not be declared (the pins above are versions, not floors).
NO_OTHER_FLOOR = ("Makefile", "README.md", ".ci", "deploy", "docs", "src", "configs")


def declared_floor() -> Version:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [Requirement(d) for d in dependencies if Requirement(d).name == "torch"]
    (spec,) = list(torch.specifier)
    assert spec.operator == ">=", f"pyproject.toml declares torch{spec}: the floor is a >= bound"
    return Version(spec.version)


def test_the_declared_floor_is_a_torch_whose_weights_only_rule_holds():
    assert declared_floor() >= WEIGHTS_ONLY_HOLDS


@pytest.mark.parametrize("path", sorted(PINS))
def test_every_pinned_torch_is_at_or_above_the_floor(path):
    text = (ROOT / path).read_text()
    pins = [Version(next(g for g in m.groups() if g)) for m in re.finditer(PINS[path], text)]
    assert pins, f"{path}: no torch pin found (the pattern in PINS is out of date)"
    assert all(pin >= declared_floor() for pin in pins), f"{path} pins torch {pins}, below {declared_floor()}"


def test_no_other_file_declares_a_torch_floor():
    floors = re.compile(r"""(?:^|[\s"'\[])torch(?:>=|~=|>)\d[\d.]*""")  # a requirement's spelling
    found = []
    for top in NO_OTHER_FLOOR:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            built = any(part.endswith(".egg-info") or part == "__pycache__" for part in path.parts)  # pip's copies
            if path.is_file() and not built and path.suffix not in (".png", ".whl", ".gz", ".pyc"):
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in floors.finditer(text)]
    assert not found, f"pyproject.toml alone declares the torch floor: {found}"


def test_the_space_bundle_pins_the_torch_it_was_exported_with_which_is_at_or_above_the_floor():
    from distrinews.export.space import dockerfile
    from distrinews.export.space.bundle import _torch_version

    rendered = dockerfile.render("torch", _torch_version(), None)
    (pin,) = re.findall(r"ARG TORCH_VERSION=([\d.]+)", rendered)
    assert pin == _torch_version() and Version(pin) >= declared_floor()


def test_the_security_page_states_the_same_floor():
    assert f"torch>={declared_floor()}" in (ROOT / "docs" / "security.md").read_text()

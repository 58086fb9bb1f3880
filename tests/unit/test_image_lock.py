"""deploy/requirements.txt, the serving image's lock (written by deploy/lock-requirements.py), agrees with
pyproject.toml: each dependency the image takes from pyproject.toml is pinned inside its range, every line is an
exact pin, no pin is torch or a GPU build, and each pinned package's own requirements are pinned within theirs
(for the packages installed here at the pinned version, whose metadata is at hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "requirements.txt"


@pytest.fixture(scope="module")
def lock():
    spec = importlib.util.spec_from_file_location("lock_requirements", ROOT / "deploy" / "lock-requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_lock_agrees_with_pyproject(lock):
    assert lock.problems(LOCK.read_text()) == []
    pins, _ = lock.pins(LOCK.read_text())
    declared = {r.name for r in lock.image_requirements()}
    assert {"transformers", "fastapi", "uvicorn", "onnxruntime", "pydantic"} <= declared and "torch" not in declared
    assert len(pins) > len(declared), "the lock pins what the image's dependencies need too"


def test_the_check_sees_each_way_a_lock_can_disagree(lock, tmp_path):
    text = LOCK.read_text()
    pins, _ = lock.pins(text)
    uvicorn = f"uvicorn=={pins['uvicorn']}"
    broken = {
        "a range, not a pin": text.replace(uvicorn, "uvicorn>=0.54"),
        "an image dependency missing": text.replace(f"fastapi=={pins['fastapi']}", ""),
        "outside pyproject's range": text.replace(uvicorn, "uvicorn==0.55.0"),
        "torch": text + "torch==2.13.0\n",
        "a GPU build": text + "nvidia-cublas-cu12==12.4.5.8\n",
    }
    for why, variant in broken.items():
        assert lock.problems(variant), why
    # pyproject.toml narrowing a range the lock does not meet
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text().replace('"uvicorn>=0.54,<0.55"', '"uvicorn>=0.55"'))
    assert any("uvicorn" in p and "outside" in p for p in lock.problems(text, pyproject))

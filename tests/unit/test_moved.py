"""Deprecated module paths still import, as the module at its current path, with a warning naming that path."""

import importlib
import subprocess
import sys
import warnings

import pytest

import distrinews.train.trainer
from distrinews._moved import MOVED_MODULES, MOVED_NAMES


def _forget(name: str) -> None:
    """So that the next import of ``name`` goes through the import system again."""
    sys.modules.pop(name, None)


def test_a_deprecated_path_gives_the_current_module_and_warns_naming_it():
    _forget("distrinews.trainer")
    with pytest.warns(DeprecationWarning, match=r"distrinews\.trainer is deprecated; import distrinews\.train\.trainer instead"):
        import distrinews.trainer as old
    assert old is distrinews.train.trainer
    assert old.__spec__.name == "distrinews.train.trainer", "the module keeps its own spec"
    assert sys.modules["distrinews.trainer"] is distrinews.train.trainer


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_every_deprecated_path_resolves(old):
    _forget(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED_MODULES[old])
    assert any(MOVED_MODULES[old] in str(w.message) for w in caught if w.category is DeprecationWarning)


@pytest.mark.parametrize("package,name", [(p, n) for p, names in sorted(MOVED_NAMES.items()) for n in sorted(names)])
def test_every_name_of_a_module_that_became_a_package_resolves(package, name):
    where = MOVED_NAMES[package][name]
    with pytest.warns(DeprecationWarning, match=rf"import {where}\.{name} instead"):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(where), name)


def test_an_unknown_name_is_still_an_attribute_error():
    import distrinews.checkpoint

    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        distrinews.checkpoint.nothing_here  # noqa: B018


def test_python_dash_m_of_a_deprecated_path_runs_the_current_module():
    proc = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "distrinews.doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "--result-dir" in proc.stdout, proc.stderr
    assert "import distrinews.cli.doctor.checks instead" in proc.stderr, proc.stderr

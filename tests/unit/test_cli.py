"""The command line's shape: every subcommand listed, a missing optional dependency named, benchmarks out of benchmarks/."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import tomllib

from distrinews import cli
from distrinews.cli import bench as bench_cli

ROOT = Path(__file__).resolve().parents[2]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_is_registered():
    commands = _subcommands(cli.build_parser())
    assert set(commands) == {"train", "eval", "predict", "export", "serve", "serve-replicas", "report", "bench", "doctor"}
    bench = {"scaling", "collectives", "serving", "replicas", "compare", "baseline", "profile", "batch", "precision"}
    assert set(_subcommands(commands["bench"])) == bench


def test_a_tool_whose_module_cannot_import_is_still_listed_and_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(bench_cli.TOOLS, "compare", ("distrinews.bench.not_installed_here", "compare", "bench"))
    parser = cli.build_parser()
    assert "compare" in _subcommands(_subcommands(parser)["bench"])
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["bench", "compare"]) == 2
    err = capsys.readouterr().err
    assert "bench compare cannot run" in err and "pip install 'distrinews[bench]'" in err


def test_a_missing_extra_is_named_when_the_tool_runs(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert cli.main(["bench", "compare", "--what", "compare"]) == 2
    assert "bench compare needs the 'bench' extra: pip install 'distrinews[bench]'" in capsys.readouterr().err


def test_bench_serving_writes_under_runs_not_over_recorded_results():
    args, _ = cli.build_parser().parse_known_args(["bench", "serving", "--checkpoint", "x"])
    assert args.output_dir == "runs/bench"


def test_the_bench_extra_brings_what_the_trainer_baseline_needs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("accelerate") for req in extras["bench"]), "transformers.Trainer needs accelerate"
    assert any(req.startswith("matplotlib") for req in extras["bench"])


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["bench", "--help"]])
def test_help_exits_cleanly(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0 and "usage: distrinews" in capsys.readouterr().out

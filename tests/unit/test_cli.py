"""The command line's shape: every subcommand listed, a missing optional dependency named, benchmarks out of
benchmarks/."""

from __future__ import annotations

import argparse
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
    assert set(commands) == {
        "train",
        "eval",
        "predict",
        "export",
        "serve",
        "serve-replicas",
        "report",
        "bench",
        "doctor",
        "tune",
        "audit",
    }
    assert set(_subcommands(commands["bench"])) == {"scaling", "collectives", "serving", "profile", "batch"}


def test_a_tool_whose_module_cannot_import_is_still_listed_and_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(bench_cli.TOOLS, "serving", ("distrinews.bench.not_installed_here", "serving"))
    parser = cli.build_parser()
    assert "serving" in _subcommands(_subcommands(parser)["bench"])
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["bench", "serving"]) == 2
    err = capsys.readouterr().err
    assert "bench serving cannot run" in err and "pip install 'distrinews[bench]'" in err


def test_bench_serving_writes_under_runs_not_over_recorded_results():
    args, _ = cli.build_parser().parse_known_args(["bench", "serving", "--checkpoint", "x"])
    assert args.output_dir == "runs/bench"


def test_the_lab_extra_brings_what_the_comparisons_need_and_the_bench_extra_only_the_plots():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("accelerate") for req in extras["lab"]), "transformers.Trainer needs accelerate"
    assert any(req.startswith("scikit-learn") for req in extras["lab"]), "the TF-IDF baseline"
    assert [req.split(">")[0] for req in extras["bench"]] == ["matplotlib"]
    assert "lab" in extras["dev"][0] and "bench" in extras["dev"][0]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["bench", "--help"]])
def test_help_exits_cleanly(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0 and "usage: distrinews" in capsys.readouterr().out


def test_the_package_never_imports_the_comparison_tools_or_the_tests():
    """benchmarks/ imports distrinews, one way: the wheel ships src/ alone, so an import back would break it."""
    import ast

    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not [n for n in names if n.split(".")[0] in ("benchmarks", "tests")], (
                f"{path.relative_to(ROOT)} imports {names}"
            )


def test_version_prints_the_declared_version_and_exits_0(capsys):
    from distrinews.version import __version__

    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.strip() == f"distrinews {__version__}"

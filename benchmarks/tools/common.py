"""What the comparison tools share: how each runs as ``python -m benchmarks.tools.NAME``, and the options and
defaults of the training comparisons, so that every loop is set up identically."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: ``benchmarks`` imports from here


def main(
    name: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], object],
    run: Callable[[argparse.Namespace, list[str]], int | None],
) -> None:
    """``python -m benchmarks.tools.NAME``: parse, run; a mistake in what was asked is one line and exit 2."""
    from distrinews.cli.common import USAGE_ERRORS, usage_error

    prog = f"python -m benchmarks.tools.{name}"
    parser = argparse.ArgumentParser(prog=prog, description=description.removeprefix(f"``{prog}``: "))
    add_arguments(parser)
    args, extra = parser.parse_known_args()
    try:
        code = int(run(args, extra) or 0)
    except USAGE_ERRORS as exc:
        code = usage_error(exc)
    raise SystemExit(code)


def tool_env(**overrides: str) -> dict[str, str]:
    """The environment of a child process that imports ``benchmarks`` (a torchrun worker), wherever it starts."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), **overrides}


def comparison_parser(description: str) -> argparse.ArgumentParser:
    """The baselines' own parser (they run under torchrun): the shared options plus where to write the result."""
    p = argparse.ArgumentParser(description=description)
    add_shared_arguments(p)
    p.add_argument("--result", required=True)
    return p


def add_shared_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--data", default=None)
    p.add_argument("--train-samples", type=int, default=3200)
    p.add_argument("--eval-samples", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--warmup-ratio", type=float, default=0.06)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: where the CPU computes bf16 in hardware)",
    )


def invoked_as(name: str) -> str:
    """The command line that ran this tool, as a user would type it again (for its report)."""
    return " ".join([f"python -m benchmarks.tools.{name}", *map(shlex.quote, sys.argv[1:])])


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def baseline_settings(a: argparse.Namespace) -> list[str]:
    """The shared settings (``common.add_shared_arguments``) as a baseline script takes them: every one of them, so a
    baseline trains on the rows, seed and recipe that ours does."""
    settings = [
        *("--model", a.model, "--train-samples", str(a.train_samples), "--batch-size", str(a.batch_size)),
        *(
            "--max-length",
            str(a.max_length),
            "--learning-rate",
            str(a.learning_rate),
            "--warmup-ratio",
            str(a.warmup_ratio),
        ),
        *("--weight-decay", str(a.weight_decay), "--max-grad-norm", str(a.max_grad_norm), "--seed", str(a.seed)),
    ]
    settings += ["--data", a.data] if a.data else []
    settings += ["--eval-samples", str(a.eval_samples)] if a.eval_samples else []
    return settings


def ours_settings(a: argparse.Namespace, options: str) -> list[str]:
    """``distrinews train`` overrides that match the baselines' settings (the cpu-quick preset's recipe)."""
    return [
        "--learning_rate",
        str(a.learning_rate),
        "--warmup_ratio",
        str(a.warmup_ratio),
        "--weight_decay",
        str(a.weight_decay),
        "--max_grad_norm",
        str(a.max_grad_norm),
        "--bf16",
        str(a.bf16).lower(),
        "--group_by_length",
        "true",
        "--seed",
        str(a.seed),
        # the baselines train on every sampled row: ours holds none out to fit a temperature on
        "--calibration",
        "none",
        *(["--data_dir", a.data] if a.data else []),
        *options.split(),
    ]

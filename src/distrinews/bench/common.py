"""What the comparison scripts share, so that they are set up identically: the same options and defaults."""

from __future__ import annotations

import argparse
import shlex
import sys


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


def invoked_as(subcommand: str) -> str:
    """The command line that ran this benchmark, as a user would type it again (for its report)."""
    if sys.argv[1:3] == ["bench", subcommand]:
        return f"distrinews bench {subcommand} " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    return " ".join(shlex.quote(a) for a in sys.argv)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def baseline_settings(a: argparse.Namespace) -> list[str]:
    """The shared settings (``common.add_shared_arguments``) as a baseline script takes them: every one of them, so a
    baseline trains on the rows, seed and recipe that ours does."""
    settings = [
        *("--model", a.model, "--train-samples", str(a.train_samples), "--batch-size", str(a.batch_size)),
        *("--max-length", str(a.max_length), "--learning-rate", str(a.learning_rate), "--warmup-ratio", str(a.warmup_ratio)),
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
        *(["--data_dir", a.data] if a.data else []),
        *options.split(),
    ]

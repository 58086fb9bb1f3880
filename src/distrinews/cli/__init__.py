"""``distrinews`` command line: one module per subcommand, registered explicitly below.

Each module has ``register(subparsers)``, which adds its parser and sets ``func(args, extra)``
and, for commands that can run as several processes, ``distributed=True``. A subcommand whose
optional dependency is missing is still listed; running it says which extra to install.

Launcher flags (``--nproc-per-node``, ``--nnodes``, ``--rdzv-endpoint``, ``--max-restarts`` ...)
are taken out of the command line first: with them, ``train``, ``eval`` and ``doctor`` run as
torchrun workers on this node (``distrinews.distributed.launch``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..distributed.launch import LaunchError, split_launch_flags, wants_launch
from ..version import __version__
from . import audit, bench, doctor, evaluate, export, predict, report, serve, serve_replicas, train, tune
from .common import USAGE_ERRORS, usage_error

COMMANDS = (train, evaluate, predict, export, serve, serve_replicas, report, bench, doctor, tune, audit)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distrinews",
        description="Fine-tune and serve a text classifier (AG News by default, or your own labelled data) "
        "with PyTorch DDP. Launcher flags: --nproc-per-node N, --nnodes N, "
        "--node-rank R, --rdzv-endpoint HOST:PORT, --rdzv-id ID, --max-restarts K.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # ours are the only bars (read at transformers import)
    try:
        flags, rest = split_launch_flags(argv)
        args, extra = build_parser().parse_known_args(rest)
        args.launch_flags, args.argv = flags, rest
        if wants_launch(flags) and not getattr(args, "distributed", False):
            raise LaunchError(
                f"{args.command} runs in one process: launcher flags ({', '.join('--' + f for f in flags)}) "
                "apply to train, eval, doctor, tune and audit"
            )
        return int(args.func(args, extra))
    except USAGE_ERRORS as exc:
        return usage_error(exc)

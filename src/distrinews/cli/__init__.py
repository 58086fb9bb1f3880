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
from typing import TYPE_CHECKING, Any, TypeAlias

from ..distributed.launch import LaunchError, record_worker_error, split_launch_flags, under_torchrun, wants_launch
from ..errors import USER_ERRORS, ConfigError, one_line
from ..serve.options import ServeOptionError
from . import audit, bench, doctor, evaluate, export, predict, report, serve, serve_replicas, train, tune

if TYPE_CHECKING:
    # What each subcommand's ``register`` receives; argparse's class is generic only in its stubs.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_USAGE = 2
COMMANDS = (train, evaluate, predict, export, serve, serve_replicas, report, bench, doctor, tune, audit)
# Errors in what the user asked for, or a full disk they can make room on: one line, exit 2, no traceback.
USAGE_ERRORS: tuple[type[Exception], ...] = (*USER_ERRORS, LaunchError, ServeOptionError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distrinews",
        description="Fine-tune and serve a text classifier (AG News by default, or your own labelled data) "
        "with PyTorch DDP. Launcher flags: --nproc-per-node N, --nnodes N, "
        "--node-rank R, --rdzv-endpoint HOST:PORT, --rdzv-id ID, --max-restarts K.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault(
        "HF_HUB_DISABLE_PROGRESS_BARS", "1"
    )  # ours are the only bars (transformers reads it at import)
    try:
        flags, rest = split_launch_flags(argv)
        args, extra = build_parser().parse_known_args(rest)
        args.launch_flags, args.argv = flags, rest
        if wants_launch(flags) and not getattr(args, "distributed", False):
            raise LaunchError(
                f"{args.command} runs in one process: launcher flags ({', '.join('--' + f for f in flags)}) "
                "apply to train, eval, doctor, tune and audit"
            )
        return args.func(args, extra)
    except USAGE_ERRORS as exc:
        return usage_error(exc)


def usage_error(exc: Exception) -> int:
    message = one_line(exc)
    if under_torchrun() and record_worker_error(message):
        return EXIT_USAGE  # our launcher prints each distinct error once
    print(message, file=sys.stderr)
    return EXIT_USAGE


def require_extra(module: str, extra: str, what: str) -> None:
    """Fail in one line, naming the extra to install, when an optional dependency is missing."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{what} needs the '{extra}' extra: pip install 'distrinews[{extra}]' (missing module {module})"
        ) from None


def require_serving(what: str) -> None:
    """The web server's packages (the ``serve`` extra)."""
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        require_extra(module, "serve", what)


def no_extra_arguments(command: str, extra: list[str]) -> None:
    if extra:
        raise ConfigError(f"{command}: unexpected arguments: {' '.join(extra)}")


def write_json(path: str, payload: Any) -> None:
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str))


def is_global_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0

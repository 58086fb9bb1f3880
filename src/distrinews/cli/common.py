"""What the subcommands share: how a mistake in what the user asked for ends (one line, exit 2), the check that an
optional dependency is installed, and the small pieces of each command's run (no stray arguments, a JSON result,
rank zero). It sits apart from ``cli/__init__.py``, which registers the subcommands, so that they import from
here and not back from the package that imports them."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from ..distributed.launch import LaunchError, record_worker_error, under_torchrun
from ..errors import USER_ERRORS, ConfigError, one_line
from ..serve.options import ServeOptionError

if TYPE_CHECKING:
    from ..config import TrainConfig

    # What each subcommand's ``register`` receives; argparse's class is generic only in its stubs.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_USAGE = 2
# Errors in what the user asked for, or a full disk they can make room on: one line, exit 2, no traceback.
USAGE_ERRORS: tuple[type[Exception], ...] = (*USER_ERRORS, LaunchError, ServeOptionError)


def usage_error(exc: Exception) -> int:
    message = one_line(exc)
    if not (under_torchrun() and record_worker_error(message)):  # else our launcher prints each distinct error once
        print(message, file=sys.stderr)
    return EXIT_USAGE


# The modules of each extra that a command checks for before it starts.
EXTRA_MODULES = {
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "onnx": ("onnx", "onnxruntime"),
    "hub": ("huggingface_hub",),
    "tune": ("optuna",),
    "audit": ("cleanlab",),
}


def require_extra(extra: str, what: str) -> None:
    """Fail in one line, naming the extra to install, when an optional dependency is missing."""
    import importlib

    for module in EXTRA_MODULES[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                f"{what} needs the '{extra}' extra: pip install 'distrinews[{extra}]' (missing module {module})"
            ) from None


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` while the block runs, as Ctrl-C does (a run saves and stops)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_config(args: argparse.Namespace, extra: list[str], **options: str) -> TrainConfig:
    """The config of ``--config`` with the ``--field value`` overrides in ``extra`` and ``--data``, and each of
    ``options`` (option: field) the command was given."""
    from ..config import load_config, parse_overrides

    overrides = parse_overrides(extra)
    for option, field in {"data": "data_dir", **options}.items():
        if getattr(args, option) is not None:
            overrides[field] = getattr(args, option)
    return load_config(args.config, overrides)  # fails here, naming the field, before anything starts


def no_extra_arguments(command: str, extra: list[str]) -> None:
    if extra:
        raise ConfigError(f"{command}: unexpected arguments: {' '.join(extra)}")


def write_json(path: str, payload: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str))


def is_global_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0

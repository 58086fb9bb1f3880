"""What the subcommands share: how a mistake in what the user asked for ends (one line, exit 2), the check that an
optional dependency is installed, and the small pieces of each command's run (no stray arguments, a JSON result,
rank zero). It sits apart from ``cli/__init__.py``, which registers the subcommands, so that they import from
here and not back from the package that imports them."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, TypeAlias

from ..distributed.launch import LaunchError, record_worker_error, under_torchrun
from ..errors import USER_ERRORS, ConfigError, one_line
from ..serve.options import ServeOptionError

if TYPE_CHECKING:
    # What each subcommand's ``register`` receives; argparse's class is generic only in its stubs.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_USAGE = 2
# Errors in what the user asked for, or a full disk they can make room on: one line, exit 2, no traceback.
USAGE_ERRORS: tuple[type[Exception], ...] = (*USER_ERRORS, LaunchError, ServeOptionError)


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

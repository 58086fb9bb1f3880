"""``distrinews serve``: the REST API under uvicorn (options in ``serve/options.py``, the run loop in
``serve/server.py``).

``MODEL_CHECKPOINT`` and ``PORT`` stand in for ``--checkpoint`` and ``--port``. SIGTERM stops
accepting connections, answers every request already in flight, finishes the batcher's
queue, then exits 0. ``python -m distrinews.serve`` is the same server without the rest of the
command line (and, for ONNX Runtime, without torch).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..serve.options import ServeConfig, add_arguments, validate
from .common import no_extra_arguments, require_extra

if TYPE_CHECKING:
    from .common import Subparsers


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a checkpoint over HTTP (REST API, demo page, metrics)")
    add_arguments(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    require_extra("serve", "serve")
    from ..checkpoint.servable import check_loadable
    from ..serve.server import run_server

    no_extra_arguments("serve", extra)
    validate(args)
    check_loadable(args.checkpoint)  # a refused or damaged checkpoint: one line and exit 2, before the server starts
    if args.runtime.startswith("onnx"):
        require_extra("onnx", f"serve --runtime {args.runtime}")
    return run_server(ServeConfig.from_args(args))

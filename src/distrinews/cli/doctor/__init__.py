"""``distrinews doctor``: check the distributed setup end to end (the command is ``checks``; each kind of check sits
beside it)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..common import Subparsers


def register(subparsers: Subparsers) -> None:
    from ...options import add_options
    from .checks import OPTIONS

    p = subparsers.add_parser(
        "doctor", help="versions, devices, backends, a real N-process rendezvous and collective check"
    )
    add_options(p, OPTIONS)
    p.set_defaults(func=run, distributed=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ...distributed.launch import launch, wants_launch

    if wants_launch(args.launch_flags):
        return launch(args.launch_flags, args.argv)
    from .checks import run as run_doctor

    return run_doctor(args, extra)

"""``distrinews doctor``: check the distributed setup end to end (see distrinews.doctor)."""

from __future__ import annotations

import argparse


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    from .doctor import run

    return run(args, extra)


def register(subparsers) -> None:
    from .doctor import add_arguments

    p = subparsers.add_parser("doctor", help="versions, devices, backends, a real N-process rendezvous and collective check")
    add_arguments(p)
    p.set_defaults(func=_run)

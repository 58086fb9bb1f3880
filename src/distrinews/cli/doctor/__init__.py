"""``distrinews doctor``: check the distributed setup end to end (the command is ``checks``; each kind of check sits
beside it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..common import Subparsers


def register(subparsers: Subparsers) -> None:
    from ...options import add_options
    from .checks import OPTIONS, run

    p = subparsers.add_parser(
        "doctor", help="versions, devices, backends, a real N-process rendezvous and collective check"
    )
    add_options(p, OPTIONS)
    p.set_defaults(func=run, distributed=True)

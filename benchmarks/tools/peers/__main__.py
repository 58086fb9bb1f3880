"""``python -m benchmarks.tools.peers install|run``: see ``benchmarks/tools/peers/__init__.py``."""

from __future__ import annotations

import argparse
import sys

from . import __doc__ as DOC
from . import install


def main(argv: list[str] | None = None) -> int:
    from distrinews.cli.common import USAGE_ERRORS, usage_error

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.peers", description=(DOC or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install.add_arguments(commands.add_parser("install", help="make the peers' own virtualenv"))
    from . import runner  # imports distrinews' serving code: not needed to install

    runner.add_arguments(commands.add_parser("run", help="measure ours and the peers, one at a time"))
    args = parser.parse_args(argv)
    try:
        return install.run(args) if args.command == "install" else runner.run(args)
    except USAGE_ERRORS as exc:
        return usage_error(exc)


if __name__ == "__main__":
    sys.exit(main())

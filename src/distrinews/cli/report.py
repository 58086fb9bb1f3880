"""``distrinews report``: a run's training curves drawn again, or several runs overlaid to compare them."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..options import Option, add_options
from .common import EXIT_USAGE, no_extra_arguments

if TYPE_CHECKING:
    from .common import Subparsers

COMPARISON_PNG = "training_curves_comparison.png"


OPTIONS = [
    Option("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each with a log.jsonl)", positional=True),
    Option(
        "output",
        help=f"PNG to write (default: RUN_DIR/training_curves.png for one run, ./{COMPARISON_PNG} for several)",
    ),
]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="draw a run's training curves (or overlay several runs) and print their results"
    )
    add_options(p, OPTIONS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..checkpoint.rundir import RunDir
    from ..train.curves import PLOT_HINT, have_matplotlib, load_runs, plot_runs, results_table

    no_extra_arguments("report", extra)
    runs = load_runs(args.run_dirs)  # a directory without a log: one line, exit 2
    print(results_table(runs))
    if not have_matplotlib():
        print(f"distrinews: error: the plot needs matplotlib, the 'plot' extra: {PLOT_HINT}", file=sys.stderr)
        return EXIT_USAGE
    output = args.output or (RunDir(args.run_dirs[0]).curves if len(runs) == 1 else COMPARISON_PNG)
    print(f"wrote {plot_runs([r.path for r in runs], output)}")
    return 0

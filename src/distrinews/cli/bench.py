"""``distrinews bench TOOL``: measure your own setup (training scaling, collectives, serving, batch labelling, where a
step's time goes); results go where ``--output-dir`` says. Comparisons with other systems are not part of the
package: they live in the repository's ``benchmarks/tools``."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..options import add_options

if TYPE_CHECKING:
    from .common import Subparsers

Run = Callable[[argparse.Namespace, list[str]], int]

# name -> (module, help)
TOOLS = {
    "scaling": (
        "distrinews.bench.scaling",
        "samples/s, speedup, efficiency and step-time breakdown for 1, 2, ... workers",
    ),
    "collectives": (
        "distrinews.bench.collectives",
        "all_reduce / all_gather / broadcast / reduce_scatter bandwidth, nccl-tests style",
    ),
    "serving": ("distrinews.bench.serving", "latency and throughput of distrinews serve, per runtime, at N clients"),
    "profile": ("distrinews.bench.step_profile", "where a training step's time goes, by kind of work (torch.profiler)"),
    "batch": (
        "distrinews.bench.batch",
        "labelling a corpus: predict --nproc N and --engine ray vs a loop posting to serve; memory; resume",
    ),
}


def register(subparsers: Subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure your own setup: " + ", ".join(TOOLS))
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="TOOL")
    for name, (module, help_text) in TOOLS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            tool = importlib.import_module(module)
        except ImportError as exc:  # still listed; running it says what is missing
            p.set_defaults(func=_unavailable(name, exc))
            continue
        add_options(p, tool.OPTIONS)
        p.set_defaults(func=tool.run)


def _unavailable(name: str, exc: ImportError) -> Run:
    def run(args: argparse.Namespace, extra: list[str]) -> int:
        from ..config import ConfigError

        raise ConfigError(f"bench {name} cannot run: {exc} (pip install 'distrinews[bench]')")

    return run

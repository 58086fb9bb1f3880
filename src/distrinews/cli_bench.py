"""``distrinews bench scaling|collectives|serving``: the benchmark tools (see benchmarks/README.md)."""

from __future__ import annotations

import argparse
import importlib


def _dispatch(module: str):
    def func(args: argparse.Namespace, extra: list[str]) -> int:
        return importlib.import_module(module).run(args, extra)

    return func


def _serving(args: argparse.Namespace, extra: list[str]) -> int:
    from .config import ConfigError
    from .bench import serving

    if extra:
        raise ConfigError(f"bench serving: unexpected arguments: {' '.join(extra)}")
    return int(serving.run(args) or 0)


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: scaling, collectives, serving")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    from .bench import collectives, scaling

    p = sub.add_parser("scaling", help="samples/s, speedup, efficiency and step-time breakdown for 1, 2, ... workers")
    scaling.add_arguments(p)
    p.set_defaults(func=_dispatch("distrinews.bench.scaling"))

    p = sub.add_parser("collectives", help="all_reduce / all_gather / broadcast / reduce_scatter bandwidth, nccl-tests style")
    collectives.add_arguments(p)
    p.set_defaults(func=_dispatch("distrinews.bench.collectives"))

    try:  # written separately; registered only when present
        serving = importlib.import_module("distrinews.bench.serving")
    except ModuleNotFoundError as exc:
        if exc.name == "distrinews.bench.serving":
            return
        serving, missing = None, exc
    except ImportError as exc:
        serving, missing = None, exc
    p = sub.add_parser("serving", help="latency and throughput of the REST API")
    if serving is None:  # present but cannot import (a missing extra): say so when it is used
        p.set_defaults(func=_unavailable(missing))
        return
    serving.add_arguments(p)
    p.set_defaults(func=_serving)


def _unavailable(exc: Exception):
    def func(args: argparse.Namespace, extra: list[str]) -> int:
        from .config import ConfigError

        raise ConfigError(f"bench serving is unavailable: {exc} (pip install 'distrinews[dev]')")

    return func

"""``distrinews bench TOOL``: the benchmark tools (scaling, collectives, serving, replicas, compare, baseline, batch,
profile, precision); their results go in benchmarks/."""

from __future__ import annotations

import argparse
import importlib

# name -> (module, help, extra the tool needs beyond the core install)
TOOLS = {
    "scaling": ("distrinews.bench.scaling", "samples/s, speedup, efficiency and step-time breakdown for 1, 2, ... workers", None),
    "collectives": (
        "distrinews.bench.collectives",
        "all_reduce / all_gather / broadcast / reduce_scatter bandwidth, nccl-tests style",
        None,
    ),
    "serving": ("distrinews.bench.serving", "latency and throughput of the REST API against the reference server", "bench"),
    "compare": ("distrinews.bench.compare", "training speed and accuracy: ours vs Hugging Face Trainer vs the reference loop", "bench"),
    "replicas": (
        "distrinews.bench.serving_replicas",
        "1 replica x all threads vs N replicas x a share behind nginx, and nginx's own cost",
        None,
    ),
    "baseline": ("distrinews.bench.baseline", "TF-IDF + logistic regression on a run's own split, beside its fine-tuned model", None),
    "profile": ("distrinews.bench.step_profile", "where a training step's time goes, by kind of work (torch.profiler)", None),
    "precision": ("distrinews.bench.precision", "one training step in each precision variant, timed side by side", None),
    "batch": (
        "distrinews.bench.batch",
        "labelling a corpus: predict --nproc N and --engine ray vs a loop posting to serve; memory; resume",
        None,
    ),
}


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: " + ", ".join(TOOLS))
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="TOOL")
    for name, (module, help_text, extra) in TOOLS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            importlib.import_module(module).add_arguments(p)
        except ImportError as exc:  # still listed; running it says what to install
            p.set_defaults(func=_unavailable(name, extra, exc))
            continue
        p.set_defaults(func=_runner(module, extra, name))


def _runner(module: str, extra: str | None, name: str):
    def run(args: argparse.Namespace, extra_args: list[str]) -> int:
        from . import require_extra

        if extra == "bench":
            require_extra("matplotlib", "bench", f"bench {name}")
        return int(importlib.import_module(module).run(args, extra_args) or 0)

    return run


def _unavailable(name: str, extra: str | None, exc: ImportError):
    def run(args: argparse.Namespace, extra_args: list[str]) -> int:
        from ..config import ConfigError

        raise ConfigError(f"bench {name} cannot run: {exc} (pip install 'distrinews[{extra or 'dev'}]')")

    return run

"""``distrinews bench scaling``: train K steps with 1, 2, ... workers and say how well it scales.

Each point is a real torchrun job. Every worker is pinned to its own cores (``sched_setaffinity``
plus the same number of torch threads), so 2 workers x 1 core against 1 worker x 1 core measures
DDP, not two processes fighting over the same core. Each timed step is the trainer's own
(``Trainer.forward_backward`` + ``Trainer.optimizer_step``: the same data, sampler, model wrapped
by ``wrap_model``, precision policy, GradScaler, accumulation and optimizer as ``distrinews
train``); only the clock around each phase is added.

Weak scaling keeps the per-worker batch (global batch grows with the workers); strong scaling keeps
the global batch (each worker gets global / n). Either way

    speedup(n)    = samples/s with n workers / samples/s with the baseline count n0
    efficiency(n) = speedup(n) / (n / n0)

A step's time is split into data (next window of micro-batches), forward + backward (including the
part of the gradient all-reduce that backward does not hide) and optimizer (clip + step + zero).
With more than one worker, a few extra windows each run forward + backward twice, without and
with the all-reduce: the paired difference is the all-reduce time backward could not hide.

This module is the command (it starts one torchrun job per point and reads rank 0's result); its
pieces are ``scaling_arithmetic`` (speedup, efficiency, batches, core sets), ``scaling_worker``
(one rank's timed steps) and ``scaling_report`` (the table and the plot).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..config import DDP_COMM_HOOKS
from ..distributed.machine import cores_available
from ..distributed.machine import describe as machine_description
from ..options import Option
from ..options.shared import BENCH_OUTPUT_DIR, CONFIG, DATA
from .results import worker_argv, write_report
from .scaling_arithmetic import core_slices, per_worker_batch, summarize
from .scaling_report import markdown_table, plot
from .scaling_worker import run_worker

T = TypeVar("T")


def run_point(args: argparse.Namespace, workers: int, bucket_cap_mb: float | None, extra: list[str]) -> dict[str, Any]:
    """One torchrun job of ``workers`` pinned processes, with the point's bucket size and per-worker batch; returns
    rank 0's figures."""
    from ..distributed.launch import torchrun_command

    batch = per_worker_batch(args.mode, args.batch, args.global_batch, workers)
    with tempfile.TemporaryDirectory(prefix="distrinews-scaling-") as tmp:
        result = os.path.join(tmp, "result.json")
        argv = worker_argv("scaling", args, OPTIONS, result, bucket_cap_mb=bucket_cap_mb, per_worker_batch=batch)
        cmd = torchrun_command(workers, [*argv, *extra])
        env = {**os.environ, "OMP_NUM_THREADS": str(args.cores_per_worker), "TOKENIZERS_PARALLELISM": "false"}
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not os.path.exists(result):
            raise RuntimeError(f"{workers} worker(s) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        point: dict[str, Any] = json.loads(Path(result).read_text())
        point["wall_s"] = time.perf_counter() - started
        return point


def parse_list(raw: str, convert: Callable[[str], T], valid: Callable[[T], bool], expected: str) -> list[T]:
    """A comma-separated list, at least one item, each converted and valid (else a ValueError naming ``expected``)."""
    values = [convert(x.strip()) for x in raw.split(",") if x.strip()]
    if not values or not all(valid(v) for v in values):
        raise ValueError(f"expected a comma-separated list of {expected}, got {raw!r}")
    return values


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median samples/s (the lower of the middle two when even), with every run's figure beside it."""
    ordered = sorted(runs, key=lambda p: p["samples_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], "runs_samples_per_s": [p["samples_per_s"] for p in runs]}


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.worker:
        return run_worker(args, extra)
    from ..config import ConfigError
    from ..distributed.launch import under_torchrun

    if under_torchrun():
        raise ConfigError("bench scaling starts its own workers: run it without --nproc-per-node or torchrun")
    if args.data:
        extra = [*extra, "--data_dir", args.data]
    counts, buckets, hooks = _parse_points(args)
    _preflight(args, extra, max(counts))
    _settle_sizes(args, counts)
    specs = [
        (n, bucket, hook)
        for n in counts
        for bucket in (buckets if n > 1 else buckets[:1])
        for hook in (hooks if n > 1 else [None])
    ]
    runs = _run_rounds(args, specs, extra)
    report = {
        "command": "distrinews " + shlex.join(sys.argv[1:]),
        "mode": args.mode,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_description(),
        "points": summarize([median_run(runs[spec]) for spec in specs]),
    }
    write_report(report, args.output_dir, args.name, markdown_table, plot)
    return 0


def _parse_points(args: argparse.Namespace) -> tuple[list[int], list[float | None], list[str | None]]:
    """The worker counts, DDP bucket sizes and comm hooks to measure (None: DDP's own), each list checked."""
    from ..config import ConfigError

    try:
        counts = sorted(set(parse_list(args.nproc, int, lambda n: n >= 1, "positive integers")))
        buckets: list[float | None] = [None]
        if args.bucket_cap_mb not in (None, "default"):
            buckets = [*parse_list(args.bucket_cap_mb, float, lambda mb: mb > 0, "positive numbers")]
        hooks: list[str | None] = [None]
        if args.comm_hooks is not None:
            named = ", ".join(DDP_COMM_HOOKS)
            hooks = [*dict.fromkeys(parse_list(args.comm_hooks, str, DDP_COMM_HOOKS.__contains__, named))]
        if args.repeat < 1:
            raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    except ValueError as exc:
        raise ConfigError(f"bench scaling: {exc}") from None
    return counts, buckets, hooks


def _preflight(args: argparse.Namespace, extra: list[str], most_workers: int) -> None:
    """What train checks before its workers start (the config, the model, every row of the data), checked alike:
    a mistake is one line here, not one traceback per point. The workers' runs go to temporary folders. Fills
    ``--batch`` from the config when not given."""
    from ..config import load_config, parse_overrides
    from ..train.preflight import preflight_train

    with tempfile.TemporaryDirectory(prefix="distrinews-scaling-preflight-") as tmp:
        config = load_config(args.config, {"output_dir": tmp, **parse_overrides(extra)})
        preflight_train(config, nproc_per_node=most_workers, lock=False)
    if args.batch is None:
        args.batch = config.batches.per_device_train_batch_size


def _settle_sizes(args: argparse.Namespace, counts: list[int]) -> None:
    """Cores per worker and the strong mode's global batch when not given, and every point's slice of cores and
    batch checked to exist."""
    from ..config import ConfigError

    cores = cores_available()
    if args.cores_per_worker is None:
        args.cores_per_worker = max(1, len(cores) // max(counts))
    if args.mode == "strong" and args.global_batch is None:
        args.global_batch = args.batch * max(counts)
    try:
        core_slices(cores, max(counts), args.cores_per_worker)
        for n in counts:
            per_worker_batch(args.mode, args.batch, args.global_batch, n)
    except ValueError as exc:
        raise ConfigError(f"bench scaling: {exc}") from None


def _run_rounds(
    args: argparse.Namespace, specs: list[tuple[int, float | None, str | None]], extra: list[str]
) -> dict[tuple[int, float | None, str | None], list[dict[str, Any]]]:
    """Every point ``--repeat`` times, in rounds, so that a slow spell of the machine touches every point alike."""
    runs: dict[tuple[int, float | None, str | None], list[dict[str, Any]]] = {spec: [] for spec in specs}
    for round_ in range(args.repeat):
        for n, bucket, hook in specs:
            label = f"{n} worker(s) x {args.cores_per_worker} core(s)"
            label += f", bucket {bucket:g} MB" if n > 1 and bucket else ""
            label += f", ddp_comm_hook {hook}" if hook else ""
            label += f" (round {round_ + 1}/{args.repeat})" if args.repeat > 1 else ""
            print(f"[scaling] {label}: {args.warmup} warm-up + {args.steps} timed steps ...", flush=True)
            p = run_point(args, n, bucket, extra + (["--ddp_comm_hook", hook] if hook else []))
            print(
                f"[scaling] {label}: {p['samples_per_s']:.1f} samples/s, "
                f"step {p['step_ms']:.0f} ms (wall {p['wall_s']:.0f} s)",
                flush=True,
            )
            runs[(n, bucket, hook)].append(p)
    return runs


OPTIONS = [
    Option("nproc", "1,2", "worker counts, comma-separated (default 1,2)"),
    Option("mode", "weak", choices=("weak", "strong")),
    Option("steps", 30, "timed steps per point", type=int),
    Option("warmup", 5, "untimed steps first", type=int),
    CONFIG,
    DATA,
    Option("batch", None, "per-worker batch (weak mode; default: the config's per_device_train_batch_size)", type=int),
    Option("global_batch", None, "strong mode: global batch (default batch x max workers)", type=int),
    Option("cores_per_worker", None, "default: cores / max workers", type=int),
    Option(
        "bucket_cap_mb",
        None,
        "DDP bucket size(s) in MB, comma-separated: one point each for n > 1 (default: the config's, see "
        "ddp_bucket_cap_mb)",
    ),
    Option(
        "comm_hooks",
        None,
        "ddp_comm_hook value(s), comma-separated (auto, none, shm, bf16, fp16): one point each for n > 1 "
        "(default: the config's)",
    ),
    Option(
        "repeat", 1, "rounds over every point; each point reports its median run by samples/s (default 1)", type=int
    ),
    Option("optimizer", "fused", choices=("fused", "foreach", "for-loop")),
    Option("pad_to_max_length", False, "pad every batch to max_length (the reference loop's)", switch=True),
    Option("host_sync", False, "read loss and accuracy to the host every step (the reference loop's)", switch=True),
    Option("no_sync_probe", 5, "extra windows timed without and with the all-reduce (n > 1)", type=int),
    BENCH_OUTPUT_DIR,
    Option("name", "scaling"),
    Option("timeout", 1800.0, "seconds per point", type=float),
    Option("worker", False, argparse.SUPPRESS, switch=True),
    Option("result", None, argparse.SUPPRESS),
    Option("per_worker_batch", None, argparse.SUPPRESS, type=int),
]

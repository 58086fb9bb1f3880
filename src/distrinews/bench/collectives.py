"""``distrinews bench collectives``: collective bandwidth the way nccl-tests reports it, and our model's share.

For each message size, t is the slowest rank's mean over the timed iterations, and algbw and busbw are
``distributed.bandwidth``'s (nccl-tests' definitions). S is the total buffer: all_gather's output (each rank
contributes S/n), reduce_scatter's input (each rank keeps S/n), the whole tensor otherwise.

Then our model: gradient bytes a DDP step all-reduces, the measured all-reduce time of that
payload, the measured forward + backward time of a real batch, and their ratio next to
the course's estimate (lesson 04's ``calculate_comm_comp_ratio``, evaluated exactly as written).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..distributed.bandwidth import bandwidths, bus_factor
from ..distributed.machine import cores_available, describe, threads_per_process
from ..options import Option
from ..options.shared import BENCH_OUTPUT_DIR, DATA
from .collectives_report import format_bytes, markdown, plot
from .results import worker_argv, write_report
from .scaling_worker import pin_to_own_cores, synchronizer

if TYPE_CHECKING:
    import torch

    from ..config import TrainConfig
    from ..distributed.process_group import DistEnv
    from ..train.flops import Peak

# A collective to time, called with no arguments; what it returns (an async handle or None) is dropped.
Collective = Callable[[], object]

OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
KIB, MIB = 1024, 1024 * 1024


# ---------------------------------------------------------------------- arithmetic
def message_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"need 4 <= min ({min_bytes}) <= max ({max_bytes}) and factor >= 2")
    return list(itertools.takewhile(lambda s: s <= max_bytes, (min_bytes * factor**i for i in itertools.count())))


def iterations_for(size_bytes: int) -> int:
    """Enough repeats to average out noise on small messages, few on the 256 MiB ones."""
    return max(3, min(50, (64 * MIB) // max(size_bytes, 1)))


def lesson_comm_comp_ratio(
    num_params: int,
    batch_size: int,
    world_size: int,
    seq_len: int = 512,
    bandwidth: float = 100e9,
    compute: float = 100e12,
) -> dict[str, float]:
    """Lesson 04's estimate, as written there: note it multiplies the *byte* count (params x 4) by
    6 x batch x seq_len as FLOPs, assumes 512 tokens, 100 GB/s and 100 TFLOP/s."""
    param_size = num_params * 4
    flops = 6 * param_size * batch_size * seq_len
    comm_bytes = 2 * (world_size - 1) / world_size * param_size
    comm_time = comm_bytes / bandwidth
    comp_time = flops / compute
    return {"comm_s": comm_time, "comp_s": comp_time, "ratio": comm_time / comp_time}


def corrected_comm_comp_ratio(
    grad_bytes: int, train_flops: float, busbw: float, peak_flops: float, world_size: int
) -> dict[str, float]:
    """The same estimate with this machine's inputs: measured busbw at the payload size, the model-FLOPs
    count of a real batch (not bytes), and the measured per-process peak."""
    comm_time = bus_factor("all_reduce", world_size) * grad_bytes / busbw
    comp_time = train_flops / peak_flops
    return {"comm_s": comm_time, "comp_s": comp_time, "ratio": comm_time / comp_time}


# ---------------------------------------------------------------------- worker
def slowest_mean_seconds(step: Collective, device: torch.device, iters: int = 5, warmup: int = 0) -> float:
    """Mean seconds per ``step()`` (a collective) over ``iters`` calls after ``warmup`` and a barrier, on the slowest
    rank (``distrinews doctor``'s bandwidth figure too)."""
    import torch
    import torch.distributed as dist

    sync = synchronizer(device)
    for _ in range(warmup):
        step()
    sync()
    dist.barrier()  # on the device the group was bound to (nccl's device_id)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _collective(op: str, count: int, value: float, env: DistEnv) -> tuple[Collective, Any, str]:
    """``op`` over ``count`` float32 elements (a multiple of the world size; all_gather's output, reduce_scatter's
    input) that every rank fills with ``value``: the call, the tensor it leaves its result in, and how it runs."""
    import torch
    import torch.distributed as dist

    n, dev = env.world_size, env.device
    if op in ("all_reduce", "broadcast"):
        x = torch.full((count,), value, device=dev)
        call = dist.all_reduce if op == "all_reduce" else functools.partial(dist.broadcast, src=0)
        return (lambda: call(x)), x, "native"
    if op == "all_gather":
        inp, out = torch.full((count // n,), value, device=dev), torch.empty(count, device=dev)
        return (lambda: dist.all_gather_into_tensor(out, inp)), out, "native"
    if op != "reduce_scatter":
        raise ValueError(op)
    inp, out = torch.full((count,), value, device=dev), torch.empty(count // n, device=dev)
    try:
        dist.reduce_scatter_tensor(out, inp)
        return (lambda: dist.reduce_scatter_tensor(out, inp)), out, "native"
    except (RuntimeError, NotImplementedError, ValueError):
        # Older gloo builds have no reduce_scatter: all_reduce and keep this rank's slice (moves ~2x the data).
        def emulated() -> None:
            buf = inp.clone()
            dist.all_reduce(buf)
            out.copy_(buf.view(n, -1)[env.rank])

        return emulated, out, "emulated: all_reduce + slice"


def check_op(op: str, env: DistEnv) -> bool:
    """Each collective gives the right numbers on a small tensor (rank r contributes r + 1)."""
    import torch

    n = env.world_size
    fn, out, _ = _collective(op, 2 * n, env.rank + 1.0, env)
    fn()
    total = n * (n + 1) / 2
    gathered = torch.arange(1, n + 1, device=env.device, dtype=out.dtype).repeat_interleave(2)
    return bool((out == {"all_reduce": total, "broadcast": 1.0, "all_gather": gathered}.get(op, total)).all())


def model_config(args: argparse.Namespace, output_dir: str) -> TrainConfig:
    """The training config whose model and batches the model section times (it writes nothing to ``output_dir``)."""
    from ..config import TrainConfig

    return TrainConfig(
        model_name_or_path=args.model,
        train_samples=args.train_samples,
        max_length=args.max_length,
        per_device_train_batch_size=args.batch_size,
        bf16=args.bf16,
        data_dir=args.data,
        output_dir=output_dir,
    )


def model_section(args: argparse.Namespace, env: DistEnv, table: list[dict[str, Any]]) -> dict[str, Any]:
    """Gradient payload, its measured all-reduce, a real batch's forward+backward, and the ratios."""
    from ..distributed.parallel import trainable_bytes
    from ..model import build_model, count_parameters
    from ..train.build import prepare_data

    config = model_config(args, tempfile.gettempdir())
    data = prepare_data(config.data, config.model.model_name_or_path, config.run.seed, env)
    model = build_model(config.model.model_name_or_path, seed=config.run.seed, labels=data.label_names)
    model.to(env.device).train()
    params = count_parameters(model)
    grad_bytes = trainable_bytes(model)
    allreduce = _collective("all_reduce", grad_bytes // 4, 1.0, env)[0]
    allreduce_s = slowest_mean_seconds(allreduce, env.device, iters=3, warmup=1)
    compute_s, batch_flops, peak = _forward_backward(args, config, data, model, env)

    # busbw of all_reduce at the message size nearest the payload, from the table just measured
    ar = [r for r in table if r["op"] == "all_reduce"]
    nearest = min(ar, key=lambda r: abs(math.log(r["bytes"] / grad_bytes))) if ar else None
    measured_busbw = bandwidths("all_reduce", grad_bytes, allreduce_s, env.world_size)[1]
    return {
        "model": args.model,
        "parameters": params,
        "gradient_bytes": grad_bytes,
        "per_device_batch": args.batch_size,
        "bf16": args.bf16,
        "max_length": args.max_length,
        "allreduce_s": allreduce_s,
        "allreduce_busbw": measured_busbw,
        "forward_backward_s": compute_s,
        "batch_model_flops": batch_flops,
        "measured_ratio": allreduce_s / compute_s,
        "lesson_estimate": lesson_comm_comp_ratio(params, args.batch_size, env.world_size),
        "corrected_estimate": corrected_comm_comp_ratio(
            grad_bytes, batch_flops, measured_busbw, peak.flops, env.world_size
        ),
        "table_busbw_near_payload": nearest["busbw"] if nearest else None,
        "peak": peak.source,
        "peak_flops": peak.flops,
    }


def _forward_backward(
    args: argparse.Namespace, config: TrainConfig, data: Any, model: Any, env: DistEnv
) -> tuple[float, float, Peak]:
    """Mean seconds of a real batch's forward and backward on the slowest rank (after one warm-up batch), the
    batches' mean model FLOPs, and the device's peak they are judged by."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from ..data.collate import Collator
    from ..data.sampler import TrainSampler
    from ..model import forward_loss
    from ..train.flops import ModelShape, peak_for
    from ..train.metrics import Counts
    from ..train.precision import Precision

    batch_size, collate = config.batches.per_device_train_batch_size, Collator(data.train_set.pad_token_id)
    sampler = TrainSampler(data.train_set, env.world_size, env.rank, batch_size, config.run.seed, False)
    loader = iter(DataLoader(data.train_set, batch_size=batch_size, sampler=sampler, collate_fn=collate))
    precision = Precision.from_config(config.precision, env.device).prepare(model)
    shape, peak = ModelShape.of(model), peak_for(env.device, precision.compute_dtype)
    sync = synchronizer(env.device)
    times, flops = [], []
    for i in range(args.compute_batches + 1):
        batch = {k: v.to(env.device) for k, v in next(loader).items()}
        sync()
        t = time.perf_counter()
        loss, logits = forward_loss(model, batch, precision.autocast)
        loss.backward()
        sync()
        if i > 0:  # the first is a warm-up
            times.append(time.perf_counter() - t)
            counts = Counts.of_batch(loss, logits, batch)
            flops.append(shape.train_flops(counts.tokens, counts.squared_lengths))
        model.zero_grad(set_to_none=True)
    slowest = torch.tensor([statistics.fmean(times)], dtype=torch.float64, device=env.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item(), statistics.fmean(flops), peak


def run_worker(args: argparse.Namespace) -> dict[str, Any] | None:
    """Every rank runs this under torchrun; rank 0 returns the report."""
    import torch

    from ..distributed.process_group import distributed_context

    cores = cores_available()  # before this rank is pinned
    pin_to_own_cores()
    with distributed_context(timeout_s=args.timeout) as env:
        if not env.distributed:
            raise SystemExit("bench collectives needs at least 2 processes (--nproc 2)")
        checks, table = _bandwidth_table(args, env)
        model = None if args.no_model else model_section(args, env, table)
        if not env.is_main:
            return None
        return {
            "command": args.command_line,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": {**describe(), "cores_available": len(cores)},
            "backend": env.backend,
            "world_size": env.world_size,
            "device": str(env.device),
            "threads_per_process": torch.get_num_threads(),
            "checks": checks,
            "table": table,
            "model": model,
        }


def _bandwidth_table(args: argparse.Namespace, env: DistEnv) -> tuple[dict[str, bool], list[dict[str, Any]]]:
    """Each op checked for correct numbers, then timed at every message size: the checks and the table's rows."""
    table, checks = [], {}
    for op in args.ops:
        checks[op] = check_op(op, env)
        for size in message_sizes(args.min_bytes, args.max_bytes):
            count = max(env.world_size, size // 4 // env.world_size * env.world_size)  # float32s, split evenly
            fn, _, how = _collective(op, count, 1.0, env)
            actual = 4 * count
            iters = iterations_for(actual)
            seconds = slowest_mean_seconds(fn, env.device, iters=iters, warmup=min(3, iters))
            alg, bus = bandwidths(op, actual, seconds, env.world_size)
            row = {"op": op, "bytes": actual, "iterations": iters, "time_us": seconds * 1e6, "algbw": alg}
            table.append({**row, "busbw": bus, "how": how})
            if env.is_main and args.verbose:
                print(
                    f"  {op:<15} {format_bytes(actual):>9}  {seconds * 1e6:12.1f} us  algbw {alg / 1e9:7.3f} GB/s  "
                    f"busbw {bus / 1e9:7.3f} GB/s  {how}",
                    flush=True,
                )
            del fn
    return checks, table


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ..config import ConfigError
    from ..distributed.launch import torchrun_command, under_torchrun

    _check_arguments(args, extra)
    if args.command_line is None:
        args.command_line = "distrinews " + shlex.join(sys.argv[1:])
    if under_torchrun():  # launched as `distrinews bench collectives --nproc-per-node N`, or our own workers
        report = run_worker(args)
        if report is not None:
            if args.result:
                Path(args.result).write_text(json.dumps(report))
            else:
                write_report(report, args.output_dir, args.name, markdown, plot)
        return 0
    if args.nproc < 2:
        raise ConfigError("bench collectives: --nproc must be at least 2")
    with tempfile.TemporaryDirectory(prefix="distrinews-collectives-") as tmp:
        if not args.no_model:  # the model section reads a model and training rows: checked as train checks them
            from ..train.preflight import preflight_train

            preflight_train(model_config(args, tmp), nproc_per_node=args.nproc, lock=False)
        result = os.path.join(tmp, "result.json")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_process(args.nproc)), "TOKENIZERS_PARALLELISM": "false"}
        cmd = torchrun_command(args.nproc, worker_argv("collectives", args, OPTIONS, result))
        proc = subprocess.run(cmd, env=env, timeout=args.timeout + 600)
        if proc.returncode != 0 or not os.path.exists(result):
            print(
                f"distrinews: error: bench collectives workers failed (exit {proc.returncode}); run `distrinews doctor "
                f"--nproc-per-node {args.nproc}` to check the distributed setup",
                file=sys.stderr,
            )
            return 1
        write_report(json.loads(Path(result).read_text()), args.output_dir, args.name, markdown, plot)
    return 0


OPTIONS = [
    Option("nproc", 2, "processes (default 2)", type=int),
    Option("min_bytes", KIB, "smallest message (default 1 KiB)", type=int),
    Option("max_bytes", 256 * MIB, "largest message (default 256 MiB)", type=int),
    Option("ops", list(OPS), f"collectives to time (default: {' '.join(OPS)})", nargs="+"),
    Option("model", "minilm", "model whose gradient payload to time (default: the shipped MiniLM)"),
    Option("no_model", False, "skip the model section", switch=True),
    DATA,
    Option("batch_size", 16, "per-process batch for the compute time", type=int),
    Option("max_length", 128, type=int),
    Option("train_samples", 2000, "rows to draw the compute batches from", type=int),
    Option("compute_batches", 5, type=int),
    Option("bf16", True, "bf16 autocast for the compute time", action=argparse.BooleanOptionalAction),
    Option("timeout", 600.0, type=float),
    BENCH_OUTPUT_DIR,
    Option("name", "collectives"),
    Option("verbose", False, "print each row as it is measured", switch=True),
    Option("worker", False, argparse.SUPPRESS, switch=True),
    Option("result", None, argparse.SUPPRESS),
    Option("command_line", None, argparse.SUPPRESS),
]


def _check_arguments(args: argparse.Namespace, extra: list[str]) -> None:
    """Unknown arguments, ops and message sizes refused before any process starts."""
    from ..config import ConfigError

    if extra and not args.worker:
        raise ConfigError(f"bench collectives: unexpected arguments: {' '.join(extra)}")
    bad = [op for op in args.ops if op not in OPS]
    if bad:
        raise ConfigError(f"bench collectives: unknown op(s) {bad}; choose from {', '.join(OPS)}")
    try:
        message_sizes(args.min_bytes, args.max_bytes)
    except ValueError as exc:
        raise ConfigError(f"bench collectives: {exc}") from None

"""One rank of a ``distrinews bench scaling`` point, under torchrun: pin this process to its cores, build the
trainer, time K of its own steps phase by phase (data, forward + backward, optimizer), probe the all-reduce
that backward could not hide (the same window's forward + backward without and with it), and have rank 0
write every rank's figures, summarized as one point, to the result file the command reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..distributed.machine import cores_available
from .scaling_arithmetic import core_slices

if TYPE_CHECKING:
    import torch

    from ..config import TrainConfig
    from ..train.metrics import Counts
    from ..train.trainer import Trainer

    # The trainer's optimizer steps, each its micro-batches.
    Windows = Iterator[list[dict[str, torch.Tensor]]]

PHASES = ("data", "forward_backward", "optimizer")


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work: CUDA's synchronize, nothing on the CPU."""
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def pin_to_own_cores(cores_per_worker: int | None = None) -> list[int]:
    """This local rank on its own slice of the cores, as in training: ``cores_per_worker`` each, or (None) an even
    share where there are enough cores to share (else it stays unpinned). The cores it runs on."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    cores = cores_available()
    if (share := cores_per_worker or len(cores) // local_world) < 1:
        return cores
    mine = core_slices(cores, local_world, share)[local_rank]
    os.sched_setaffinity(0, mine)
    return mine


def run_worker(args: argparse.Namespace, extra: list[str]) -> int:
    """K timed training steps on this rank, each the trainer's own step; rank 0 writes every rank's figures."""
    cores = pin_to_own_cores(args.cores_per_worker)
    import torch

    from ..distributed.parallel import ddp_bucket_cap_mb
    from ..distributed.process_group import all_gather_object, barrier, distributed_context
    from ..train.trainer import Trainer

    config = _point_config(args, extra)
    with distributed_context(threads=args.cores_per_worker) as env:
        trainer = Trainer(config, env, make_optimizer=_reference_optimizer(args, config.optimizer.learning_rate))
        timer = _StepTimer(trainer, _windows(trainer, args), args.host_sync)
        torch.manual_seed(config.run.seed + env.rank)
        trainer.model.train()
        elapsed, counts = _timed_steps(timer, args.warmup, args.steps)
        probe_local, probe_sync = _probe_exposed_allreduce(timer, args.no_sync_probe) if env.distributed else ([], [])
        barrier(env)
        mine = {
            "rank": env.rank,
            "cores": cores,
            "threads": torch.get_num_threads(),
            "elapsed_s": elapsed,
            "samples": counts.samples,
            "tokens": counts.tokens,
            "sum_sq_len": counts.squared_lengths,
            "padded_tokens": timer.padded_tokens,
            "phases_ms": {k: 1000 * statistics.fmean(v) for k, v in timer.phases.items()},
            "fwd_bwd_no_sync_ms": 1000 * statistics.fmean(probe_local) if probe_local else None,
            "fwd_bwd_sync_ms": 1000 * statistics.fmean(probe_sync) if probe_sync else None,
        }
        ranks = all_gather_object(mine, env)
        if env.is_main:
            point = _point(args, trainer, ranks, ddp_bucket_cap_mb(config.parallel, env.device))
            Path(args.result).write_text(json.dumps(point, indent=2))
    return 0


def _point_config(args: argparse.Namespace, extra: list[str]) -> TrainConfig:
    """The training config of this point: the command's overrides, this point's batch, steps and bucket size."""
    from ..config import load_config, parse_overrides
    from ..train.build import check_precision_supported

    overrides = parse_overrides(extra)
    overrides["per_device_train_batch_size"] = args.per_worker_batch
    overrides["max_steps"] = args.warmup + args.steps + args.no_sync_probe
    if args.bucket_cap_mb not in (None, "default"):
        overrides["ddp_bucket_cap_mb"] = float(args.bucket_cap_mb)
    overrides.setdefault("output_dir", tempfile.mkdtemp(prefix="distrinews-scaling-run-"))
    config = load_config(args.config, overrides)
    check_precision_supported(config.precision)
    return config


def _reference_optimizer(
    args: argparse.Namespace, learning_rate: float
) -> Callable[[torch.nn.Module], torch.optim.Optimizer] | None:
    """The reference loop's optimizer unless ``--optimizer fused`` (None: the trainer's own, fused AdamW): one
    group, torch's per-tensor loop or multi-tensor foreach."""
    import torch

    if args.optimizer == "fused":
        return None
    return lambda model: torch.optim.AdamW(model.parameters(), lr=learning_rate, foreach=args.optimizer == "foreach")


def _timed_steps(timer: _StepTimer, warmup: int, steps: int) -> tuple[float, Counts]:
    """``warmup`` untimed steps, then ``steps`` timed ones between barriers: their seconds and their counts."""
    from ..distributed.process_group import barrier

    trainer, env = timer.trainer, timer.trainer.env
    for _ in range(warmup):
        timer.step(timed=False)
    trainer.take_window_counts()  # the warm-up steps' counts, dropped
    barrier(env)
    started = time.perf_counter()
    for _ in range(steps):
        timer.step(timed=True)
    barrier(env)
    return time.perf_counter() - started, trainer.take_window_counts()  # the timed steps only


def _windows(trainer: Trainer, args: argparse.Namespace) -> Windows:
    """Endless optimizer windows from the trainer's own data and sampler (optionally padded to max_length)."""
    from torch.utils.data import DataLoader

    from ..data.collate import Collator
    from ..train.components import optimizer_windows

    config = trainer.config
    # --pad-to-max-length: the seed's batches, every row padded to max_length whatever the batch's longest row
    multiple = config.data.max_length if args.pad_to_max_length else config.batches.pad_to_multiple_of
    collate = Collator(trainer.data.train_set.pad_token_id, multiple)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        for epoch in range(10**6):
            trainer.sampler.set_epoch(epoch)
            yield from DataLoader(
                trainer.data.train_set,
                batch_size=config.batches.per_device_train_batch_size,
                sampler=trainer.sampler,
                collate_fn=collate,
                num_workers=config.batches.dataloader_num_workers,
                pin_memory=trainer.env.device.type == "cuda",
            )

    return optimizer_windows(batches(), config.batches.gradient_accumulation_steps)


class _StepTimer:
    """The trainer's step with a clock around each phase: data, forward + backward, optimizer."""

    def __init__(self, trainer: Trainer, windows: Windows, host_sync: bool):
        self.trainer, self.windows, self.host_sync = trainer, windows, host_sync
        self.sync = synchronizer(trainer.env.device)
        self.phases: dict[str, list[float]] = {k: [] for k in PHASES}
        self.padded_tokens = 0

    def step(self, timed: bool) -> None:
        t0 = time.perf_counter()
        window = next(self.windows)
        t1 = time.perf_counter()
        self.trainer.forward_backward(window)
        self.sync()
        t2 = time.perf_counter()
        self.trainer.optimizer_step()
        if self.host_sync:  # the reference loop's meter: loss and accuracy read back every step
            self.trainer.window_counts.loss, self.trainer.window_counts.accuracy  # noqa: B018
        self.sync()
        t3 = time.perf_counter()
        if timed:
            for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2)):
                self.phases[name].append(dt)
            self.padded_tokens += sum(b["input_ids"].numel() for b in window)


def _probe_exposed_allreduce(timer: _StepTimer, probes: int) -> tuple[list[float], list[float]]:
    """The all-reduce backward could not hide: the same window's forward + backward without and with it
    (paired, because with length grouping consecutive batches differ a lot in length)."""
    trainer, windows, sync = timer.trainer, timer.windows, timer.sync
    local: list[float] = []
    synced: list[float] = []
    for _ in range(probes):
        window = next(windows)
        for allreduce, times in ((False, local), (True, synced)):
            sync()
            t = time.perf_counter()
            trainer.forward_backward(window, sync=allreduce)
            sync()
            times.append(time.perf_counter() - t)
            trainer.optimizer.zero_grad(set_to_none=True)
    return local, synced


def _point(args: argparse.Namespace, trainer: Trainer, ranks: list[dict[str, Any]], bucket: float) -> dict[str, Any]:
    """Rank 0's summary of one scaling point from every rank's figures."""
    from ..model import count_parameters
    from ..train.flops import mfu

    config, env = trainer.config, trainer.env
    W, B = env.world_size, config.batches.per_device_train_batch_size
    elapsed = max(r["elapsed_s"] for r in ranks)
    samples = sum(r["samples"] for r in ranks)
    tokens = sum(r["tokens"] for r in ranks)
    flops = trainer.shape.train_flops(tokens, sum(r["sum_sq_len"] for r in ranks))
    local = [r["fwd_bwd_no_sync_ms"] for r in ranks if r["fwd_bwd_no_sync_ms"] is not None]
    synced = [r["fwd_bwd_sync_ms"] for r in ranks if r["fwd_bwd_sync_ms"] is not None]
    return {
        "workers": W,
        "cores_per_worker": args.cores_per_worker,
        "per_worker_batch": B,
        "global_batch": B * W,
        "gradient_accumulation_steps": config.batches.gradient_accumulation_steps,
        "bucket_cap_mb": bucket if W > 1 else None,
        "ddp_comm_hook": config.parallel.ddp_comm_hook if W > 1 else None,
        "allreduce": trainer.model.allreduce if W > 1 else None,  # what the hook came to: shared memory, gloo, ...
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "elapsed_s": elapsed,
        "samples_per_s": samples / elapsed,
        "tokens_per_s": tokens / elapsed,
        "padded_tokens_per_s": sum(r["padded_tokens"] for r in ranks) / elapsed,
        "step_ms": 1000 * elapsed / args.steps,
        "phases_ms": {k: statistics.fmean(r["phases_ms"][k] for r in ranks) for k in PHASES},
        "fwd_bwd_no_sync_ms": statistics.fmean(local) if local else None,
        "fwd_bwd_sync_ms": statistics.fmean(synced) if synced else None,
        "exposed_allreduce_ms": (statistics.fmean(synced) - statistics.fmean(local)) if local else None,
        "mfu": mfu(flops, elapsed, trainer.peak.flops, W),
        "peak": trainer.peak.source,
        "peak_tflops": trainer.peak.flops / 1e12,
        "gradient_bytes": trainer.model.trainable_bytes(),
        "parameters": count_parameters(trainer.model.raw),
        "model": config.model.model_name_or_path,
        "max_length": config.data.max_length,
        "precision": trainer.precision.name,
        "bf16": config.precision.bf16,
        "group_by_length": config.batches.group_by_length,
        "pad_to_max_length": args.pad_to_max_length,
        "optimizer": args.optimizer,
        "host_sync": args.host_sync,
        "device": str(env.device),
        "backend": env.backend,
        "ranks": ranks,
    }

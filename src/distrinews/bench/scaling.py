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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..distributed.machine import cores_available
from ..distributed.machine import describe as machine_description
from .report import write_report

PHASES = ("data", "forward_backward", "optimizer")


# ---------------------------------------------------------------------- arithmetic
def speedup(samples_per_s: float, baseline_samples_per_s: float) -> float:
    return samples_per_s / baseline_samples_per_s if baseline_samples_per_s > 0 else float("nan")


def efficiency(speedup_value: float, workers: int, baseline_workers: int = 1) -> float:
    """Speedup over the ideal speedup ``workers / baseline_workers``."""
    return speedup_value / (workers / baseline_workers)


def per_worker_batch(mode: str, batch: int, global_batch: int | None, workers: int) -> int:
    """Weak: every worker keeps ``batch``. Strong: ``global_batch`` shared out (must divide evenly)."""
    if mode == "weak":
        return batch
    if mode != "strong":
        raise ValueError(f"mode must be weak or strong, not {mode!r}")
    if global_batch is None or global_batch % workers:
        raise ValueError(f"strong scaling needs a global batch divisible by every worker count (got {global_batch} for {workers})")
    return global_batch // workers


def core_slices(cores: list[int], workers: int, cores_per_worker: int) -> list[list[int]]:
    """Disjoint core sets, one per local rank; fails when the machine has too few cores."""
    need = workers * cores_per_worker
    if need > len(cores):
        raise ValueError(f"{workers} workers x {cores_per_worker} cores need {need} cores; this process may use {len(cores)} ({cores})")
    return [cores[i * cores_per_worker : (i + 1) * cores_per_worker] for i in range(workers)]


def summarize(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup and efficiency to each point, against the point with the fewest workers."""
    if not points:
        return []
    base = min(points, key=lambda p: (p["workers"], p.get("bucket_cap_mb") or 0))
    rows = []
    for p in points:
        s = speedup(p["samples_per_s"], base["samples_per_s"])
        rows.append({**p, "speedup": s, "efficiency": efficiency(s, p["workers"], base["workers"]), "baseline_workers": base["workers"]})
    return rows


# ---------------------------------------------------------------------- the worker (under torchrun)
def _pin(cores_per_worker: int) -> list[int]:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    cores = cores_available()
    mine = core_slices(cores, local_world, cores_per_worker)[local_rank]
    os.sched_setaffinity(0, mine)
    return mine


class PadToMaxLength:
    """The seed's batches: every row padded to ``max_length`` whatever the batch's longest row."""

    def __init__(self, pad_token_id: int, max_length: int):
        self.pad_token_id = pad_token_id
        self.max_length = max_length

    def __call__(self, batch):
        import torch

        input_ids = torch.full((len(batch), self.max_length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), self.max_length), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : ids.numel()] = ids
            attention_mask[row, : ids.numel()] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": torch.tensor([y for _, y in batch])}


def run_worker(args: argparse.Namespace, extra: list[str]) -> int:
    """K timed training steps on this rank, each the trainer's own step; rank 0 writes every rank's figures."""
    cores = _pin(args.cores_per_worker)
    import torch

    from ..config import load_config, parse_overrides
    from ..distributed.parallel import ddp_bucket_cap_mb
    from ..distributed.process_group import all_gather_object, barrier, distributed_context
    from ..train.precision import check_precision_supported
    from ..train.trainer import Trainer

    overrides = parse_overrides(extra)
    overrides["per_device_train_batch_size"] = args.per_worker_batch
    overrides["max_steps"] = args.warmup + args.steps + args.no_sync_probe
    if args.bucket_cap_mb not in (None, "default"):
        overrides["ddp_bucket_cap_mb"] = float(args.bucket_cap_mb)
    overrides.setdefault("output_dir", tempfile.mkdtemp(prefix="distrinews-scaling-run-"))
    config = load_config(args.config, overrides)
    check_precision_supported(config.precision)
    make_optimizer = None
    if args.optimizer != "fused":  # the reference loop's: one group, torch's per-tensor loop or multi-tensor foreach

        def make_optimizer(model):
            return torch.optim.AdamW(model.parameters(), lr=config.learning_rate, foreach=args.optimizer == "foreach")

    with distributed_context(threads=args.cores_per_worker) as env:
        trainer = Trainer(config, env, make_optimizer=make_optimizer)
        windows = _windows(trainer, args)
        torch.manual_seed(config.seed + env.rank)
        trainer.model.train()
        timer = _StepTimer(trainer, windows, args.host_sync)
        for _ in range(args.warmup):
            timer.step(timed=False)
        trainer.take_window_counts()  # the warm-up steps' counts, dropped
        barrier(env)
        started = time.perf_counter()
        for _ in range(args.steps):
            timer.step(timed=True)
        barrier(env)
        elapsed = time.perf_counter() - started
        counts = trainer.take_window_counts()  # the timed steps only
        probe_local, probe_sync = _probe_exposed_allreduce(trainer, windows, args.no_sync_probe) if env.distributed else ([], [])
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
            Path(args.result).write_text(json.dumps(_point(args, trainer, ranks, ddp_bucket_cap_mb(config.parallel, env.device)), indent=2))
    return 0


def _windows(trainer, args: argparse.Namespace):
    """Endless optimizer windows from the trainer's own data and sampler (optionally padded to max_length)."""
    from torch.utils.data import DataLoader

    from ..data.collate import Collator
    from ..train.trainer import optimizer_windows

    config = trainer.config
    pad = trainer.data.train.pad_token_id
    collate = PadToMaxLength(pad, config.max_length) if args.pad_to_max_length else Collator(pad, config.pad_to_multiple_of)

    def batches():
        for epoch in range(10**6):
            trainer.sampler.set_epoch(epoch)
            yield from DataLoader(
                trainer.data.train,
                batch_size=config.per_device_train_batch_size,
                sampler=trainer.sampler,
                collate_fn=collate,
                num_workers=config.dataloader_num_workers,
                pin_memory=trainer.env.device.type == "cuda",
            )

    return optimizer_windows(batches(), config.gradient_accumulation_steps)


class _StepTimer:
    """The trainer's step with a clock around each phase: data, forward + backward, optimizer."""

    def __init__(self, trainer, windows, host_sync: bool):
        import torch

        self.trainer, self.windows, self.host_sync = trainer, windows, host_sync
        self.sync = torch.cuda.synchronize if trainer.env.device.type == "cuda" else (lambda: None)
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


def _probe_exposed_allreduce(trainer, windows, probes: int) -> tuple[list[float], list[float]]:
    """The all-reduce backward could not hide: the same window's forward + backward without and with it
    (paired, because with length grouping consecutive batches differ a lot in length)."""
    import torch

    sync = torch.cuda.synchronize if trainer.env.device.type == "cuda" else (lambda: None)
    local, synced = [], []
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


def _point(args: argparse.Namespace, trainer, ranks: list[dict[str, Any]], bucket: float) -> dict[str, Any]:
    """Rank 0's summary of one scaling point from every rank's figures."""
    from ..model import count_parameters
    from ..train.flops import mfu

    config, env = trainer.config, trainer.env
    W, B = env.world_size, config.per_device_train_batch_size
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
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "bucket_cap_mb": bucket if W > 1 else None,
        "ddp_comm_hook": config.ddp_comm_hook if W > 1 else None,
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
        "gradient_bytes": trainer.model.gradient_bytes()
        or sum(p.numel() * p.element_size() for p in trainer.model.raw.parameters() if p.requires_grad),
        "parameters": count_parameters(trainer.model.raw),
        "model": config.model_name_or_path,
        "max_length": config.max_length,
        "precision": trainer.precision.name,
        "bf16": config.bf16,
        "group_by_length": config.group_by_length,
        "pad_to_max_length": args.pad_to_max_length,
        "optimizer": args.optimizer,
        "host_sync": args.host_sync,
        "device": str(env.device),
        "backend": env.backend,
        "ranks": ranks,
    }


# ---------------------------------------------------------------------- the orchestrator
def worker_argv(args: argparse.Namespace, workers: int, bucket_cap_mb: float | None, result: str, extra: list[str]) -> list[str]:
    argv = [
        "bench",
        "scaling",
        "--worker",
        "--result",
        result,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--cores-per-worker",
        str(args.cores_per_worker),
        "--bucket-cap-mb",
        "default" if bucket_cap_mb is None else str(bucket_cap_mb),
        "--per-worker-batch",
        str(per_worker_batch(args.mode, args.batch, args.global_batch, workers)),
        "--optimizer",
        args.optimizer,
        "--no-sync-probe",
        str(args.no_sync_probe),
    ]
    if args.config:
        argv += ["--config", args.config]
    if args.pad_to_max_length:
        argv.append("--pad-to-max-length")
    if args.host_sync:
        argv.append("--host-sync")
    return argv + list(extra)


def run_point(args: argparse.Namespace, workers: int, bucket_cap_mb: float | None, extra: list[str], log=print) -> dict[str, Any]:
    """One torchrun job of ``workers`` pinned processes; returns rank 0's figures."""
    from ..distributed.launch import torchrun_command

    with tempfile.TemporaryDirectory(prefix="distrinews-scaling-") as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = torchrun_command(workers, worker_argv(args, workers, bucket_cap_mb, result, extra))
        env = {**os.environ, "OMP_NUM_THREADS": str(args.cores_per_worker), "TOKENIZERS_PARALLELISM": "false"}
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not os.path.exists(result):
            raise RuntimeError(f"{workers} worker(s) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        point = json.loads(Path(result).read_text())
        point["wall_s"] = time.perf_counter() - started
        return point


def parse_int_list(raw: str) -> list[int]:
    values = [int(x) for x in raw.split(",") if x.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"expected a comma-separated list of positive integers, got {raw!r}")
    return sorted(set(values))


def parse_float_list(raw: str) -> list[float]:
    values = [float(x) for x in raw.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"expected a comma-separated list of positive numbers, got {raw!r}")
    return values


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.worker:
        return run_worker(args, extra)
    from ..config import ConfigError
    from ..distributed.launch import under_torchrun

    if under_torchrun():
        raise ConfigError("bench scaling starts its own workers: run it without --nproc-per-node or torchrun")
    try:
        counts = parse_int_list(args.nproc)
        buckets = [None] if args.bucket_cap_mb in (None, "default") else parse_float_list(args.bucket_cap_mb)
    except ValueError as exc:
        raise ConfigError(f"bench scaling: {exc}") from None
    from ..config import load_config, parse_overrides

    config = load_config(args.config, parse_overrides(extra))  # a bad field fails here, before any worker starts
    if args.batch is None:
        args.batch = config.per_device_train_batch_size
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

    points = []
    for n in counts:
        for bucket in buckets if n > 1 else buckets[:1]:
            label = f"{n} worker(s) x {args.cores_per_worker} core(s)" + (f", bucket {bucket:g} MB" if n > 1 and bucket else "")
            print(f"[scaling] {label}: {args.warmup} warm-up + {args.steps} timed steps ...", flush=True)
            p = run_point(args, n, bucket, extra)
            print(
                f"[scaling] {label}: {p['samples_per_s']:.1f} samples/s, step {p['step_ms']:.0f} ms (wall {p['wall_s']:.0f} s)", flush=True
            )
            points.append(p)
    rows = summarize(points)
    report = {
        "command": "distrinews " + " ".join(sys.argv[1:]),
        "mode": args.mode,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_description(),
        "points": rows,
    }
    write_report(report, args.output_dir, args.name, markdown_table, plot)
    return 0


# ---------------------------------------------------------------------- reporting
def markdown_table(report: dict[str, Any]) -> str:
    lines = [
        f"Scaling ({report['mode']}), {report['date']}: {report['machine']['cpu']}, "
        f"{report['machine']['cores_available']} cores, torch {report['machine']['torch']}",
        "",
        f"`{report['command']}`",
        "",
        "| workers x cores | batch/worker | bucket MB | samples/s | tokens/s | speedup | efficiency | step ms | "
        "data | forward + backward (+all-reduce) | optimizer | probe: fwd+bwd no_sync | probe: fwd+bwd with all-reduce "
        "| exposed all-reduce | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["points"]:
        ph = r["phases_ms"]
        opt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        lines.append(
            f"| {r['workers']} x {r['cores_per_worker']} | {r['per_worker_batch']} | {_bucket(r)} | "
            f"{r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['speedup']:.3f} | {100 * r['efficiency']:.1f}% | "
            f"{r['step_ms']:.0f} | "
            f"{ph['data']:.1f} | {ph['forward_backward']:.0f} | {ph['optimizer']:.0f} | "
            f"{opt(r['fwd_bwd_no_sync_ms'])} | {opt(r['fwd_bwd_sync_ms'])} | {opt(r['exposed_allreduce_ms'])} | {100 * r['mfu']:.1f}% |"
        )
    first = report["points"][0]
    lines += [
        "",
        f"Model {first['model']} ({first['parameters'] / 1e6:.1f}M parameters, {first['gradient_bytes'] / 2**20:.1f} MiB of "
        f"gradients a step), max_length {first['max_length']}, {first['precision']}, group_by_length {first['group_by_length']}, "
        f"{first['steps']} timed steps after {first['warmup_steps']} warm-up, each the trainer's own step. Phase times "
        f"are per step, mean over ranks (ms); the probe columns time the trainer's forward + backward on the same "
        f"extra windows without and with the all-reduce (their difference is the exposed all-reduce). "
        f"MFU peak: {first['peak']}.",
        "",
    ]
    return "\n".join(lines)


def _bucket(r: dict[str, Any]) -> str:
    if not r["bucket_cap_mb"]:
        return "-"
    hook = r.get("ddp_comm_hook")
    return f"{r['bucket_cap_mb']:g}" + (f" ({hook} comm)" if hook and hook != "none" else "")


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = report["points"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    workers = sorted({r["workers"] for r in rows})
    base = rows[0]["baseline_workers"]
    ax.plot(workers, [w / base for w in workers], "k--", label="ideal")
    buckets = sorted({r["bucket_cap_mb"] for r in rows if r["bucket_cap_mb"]})
    for b in buckets or [None]:
        pts = sorted([r for r in rows if r["bucket_cap_mb"] in (b, None)], key=lambda r: r["workers"])
        ax.plot([r["workers"] for r in pts], [r["speedup"] for r in pts], "o-", label=f"measured, bucket {b:g} MB" if b else "measured")
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup (samples/s)")
    ax.set_xticks(workers)
    ax.set_title(f"{report['mode']} scaling")
    ax.legend()
    labels = [f"{r['workers']}w" + (f"\n{r['bucket_cap_mb']:g}MB" if r["bucket_cap_mb"] else "") for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [r["phases_ms"][phase] for r in rows]
        bx.bar(labels, vals, bottom=bottom, label=phase)
        bottom = [a + b for a, b in zip(bottom, vals)]
    exposed = [r["exposed_allreduce_ms"] for r in rows]
    for i, e in enumerate(exposed):
        if e is not None:
            bx.annotate(f"exposed all-reduce {e:.0f} ms", (i, bottom[i]), ha="center", va="bottom", fontsize=7)
    bx.set_ylabel("ms per step (mean over ranks)")
    bx.set_title("where a step's time goes")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", default="1,2", help="worker counts, comma-separated (default 1,2)")
    p.add_argument("--mode", choices=("weak", "strong"), default="weak")
    p.add_argument("--steps", type=int, default=30, help="timed steps per point")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--config", help="training preset (default: TrainConfig's defaults); --field value overrides follow")
    p.add_argument(
        "--batch", type=int, default=None, help="per-worker batch (weak mode; default: the config's per_device_train_batch_size)"
    )
    p.add_argument("--global-batch", type=int, default=None, help="strong mode: global batch (default batch x max workers)")
    p.add_argument("--cores-per-worker", type=int, default=None, help="default: cores / max workers")
    p.add_argument(
        "--bucket-cap-mb",
        default=None,
        help="DDP bucket size(s) in MB, comma-separated: one point each for n > 1 (default: the config's, see ddp_bucket_cap_mb)",
    )
    p.add_argument("--optimizer", choices=("fused", "foreach", "for-loop"), default="fused")
    p.add_argument("--pad-to-max-length", action="store_true", help="pad every batch to max_length (the reference loop's)")
    p.add_argument("--host-sync", action="store_true", help="read loss and accuracy to the host every step (the reference loop's)")
    p.add_argument("--no-sync-probe", type=int, default=5, help="extra windows timed without and with the all-reduce (n > 1)")
    p.add_argument("--output-dir", default="runs/bench")
    p.add_argument("--name", default="scaling")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--per-worker-batch", type=int, help=argparse.SUPPRESS)

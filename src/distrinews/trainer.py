"""The training loop, one code path for 1 and N processes. Read it top to bottom.

    config -> data -> model -> distributed wrap -> loop (accumulate, clip, step, log, eval, save)

Only rank 0 prints, shows the progress bar, writes logs and saves; every rank reaches every
collective (metric reductions, RNG gathering), and none of them sits inside ``if is_main``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from . import checkpoint as ckpt
from .bench.flops import ModelShape, batch_length_stats, mfu, peak_for
from .config import ConfigError, TrainConfig
from .data import Collator, TokenizedDataset, TrainSampler, load_split, stratified_sample, tokenize_cached
from .distributed import DistEnv, all_gather_object, all_reduce_sum, distributed_context, main_process_first
from .evaluation import autocast_context, evaluate
from .metrics import MetricsLogger
from .model import build_model, build_tokenizer, count_parameters


def check_runtime(config: TrainConfig) -> None:
    """Checks that depend on the machine, made before any process group exists."""
    if config.fp16 and not torch.cuda.is_available():
        raise ConfigError("config field 'fp16': fp16 with GradScaler needs CUDA; on CPU use bf16: true")
    if config.bf16 and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError("config field 'bf16': this GPU has no bf16; use fp16: true")


def train(config: TrainConfig) -> dict[str, Any]:
    check_runtime(config)
    with distributed_context() as env:
        return run_training(config, env)


# ---------------------------------------------------------------------- data
@dataclass
class Datasets:
    train: TokenizedDataset
    test: TokenizedDataset
    tokenizer: Any


def prepare_data(config: TrainConfig, env: DistEnv, need_train: bool = True) -> Datasets:
    """Read, sample and tokenize; each node's first process builds the token cache, the others read it."""
    tokenizer = build_tokenizer(config.model_name_or_path)
    with main_process_first(env, local=True):
        splits = {}
        for name, limit in (("train", config.train_samples), ("test", config.eval_samples)):
            if name == "train" and not need_train:
                continue
            raw = load_split(config.data_dir, name)
            raw = raw.subset(stratified_sample(raw.labels, limit, config.seed))
            splits[name] = tokenize_cached(raw, tokenizer, config.max_length, config.cache_dir, build=env.is_local_main)
    return Datasets(splits.get("train"), splits["test"], tokenizer)


# ---------------------------------------------------------------------- optimisation
def build_optimizer(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # One fused kernel for the whole update instead of a loop over 100+ tensors.
    return torch.optim.AdamW(groups, lr=config.learning_rate, fused=device.type in ("cpu", "cuda"))


def ddp_bucket_cap_mb(config: TrainConfig, device: torch.device) -> float:
    if config.ddp_bucket_cap_mb is not None:
        return config.ddp_bucket_cap_mb
    return 25.0 if device.type == "cuda" else 100.0


def wrap_ddp(model: torch.nn.Module, config: TrainConfig, env: DistEnv) -> DDP:
    """DDP with gradients all-reduced in ``ddp_bucket_cap_mb`` buckets while backward runs."""
    ddp = DDP(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=ddp_bucket_cap_mb(config, env.device),
        gradient_as_bucket_view=True,
        **_no_buffer_sync(),
    )
    if config.ddp_comm_hook != "none":  # half the bytes on the wire; the optimizer still sees fp32 gradients
        ddp.register_comm_hook(None, _compressed_allreduce(torch.bfloat16 if config.ddp_comm_hook == "bf16" else torch.float16))
    return ddp


def _compressed_allreduce(dtype: torch.dtype):
    """A DDP comm hook: average each gradient bucket in ``dtype``. torch's own bf16 hook refuses
    anything but NCCL; gloo reduces bf16 and fp16 fine."""
    import torch.distributed as dist

    def hook(state, bucket):
        compressed = bucket.buffer().to(dtype).div_(dist.get_world_size())
        future = dist.all_reduce(compressed, async_op=True).get_future()

        def decompress(fut):
            out = bucket.buffer()
            out.copy_(fut.value()[0])
            return out

        return future.then(decompress)

    return hook


# ---------------------------------------------------------------------- the loop
def run_training(config: TrainConfig, env: DistEnv) -> dict[str, Any]:
    say = print if env.is_main else (lambda *a, **k: None)
    if not env.is_main:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # one copy of the library's warnings, from rank 0
    run_dir = Path(config.output_dir)
    started = time.perf_counter()

    if config.strategy == "single" and env.distributed:
        raise ConfigError(f"config field 'strategy': 'single' cannot run with {env.world_size} processes; use ddp or auto")
    use_ddp = env.distributed

    # -- data
    data = prepare_data(config, env)
    B, GA, W = config.per_device_train_batch_size, config.gradient_accumulation_steps, env.world_size
    # The sampler deals out whole optimizer steps (B x GA rows a rank), so the rows of step k are
    # the same however they are split into processes and micro-batches.
    sampler = TrainSampler(data.train, W, env.rank, B * GA, config.seed, config.group_by_length)
    micro_per_epoch = math.ceil(len(sampler) / B)
    steps_per_epoch = math.ceil(micro_per_epoch / GA)
    total_steps = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * steps_per_epoch)
    num_epochs = math.ceil(total_steps / steps_per_epoch)

    # -- model, wrapped for DDP
    model = build_model(config.model_name_or_path, dropout=config.dropout, seed=config.seed).to(env.device)
    raw_model = model
    if use_ddp:
        model = wrap_ddp(model, config, env)
    optimizer = build_optimizer(raw_model, config, env.device)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(config.warmup_ratio * total_steps), total_steps)
    scaler = torch.amp.GradScaler("cuda") if config.fp16 else None

    # -- resume
    state = {"global_step": 0, "epoch": 0, "step_in_epoch": 0, "best_accuracy": None, "last_eval": {}}
    resume_from = ckpt.resolve_resume(config.resume_from_checkpoint, run_dir)
    if resume_from is not None:
        loaded, rng_states = ckpt.load_resumable(resume_from, raw_model, optimizer, scheduler, scaler)
        state.update({k: loaded[k] for k in state if k in loaded})
        if loaded.get("world_size") != W:
            say(f"warning: checkpoint was written with {loaded.get('world_size')} processes, resuming with {W}: data order differs from an uninterrupted run")
        ckpt.restore_rng_state(rng_states[env.rank % len(rng_states)])
        if state["step_in_epoch"] >= steps_per_epoch:  # saved on an epoch's last step, before the epoch closed
            state["epoch"], state["step_in_epoch"] = state["epoch"] + 1, 0
    else:
        torch.manual_seed(config.seed + env.rank)  # dropout differs across ranks, repeatably

    logger = MetricsLogger(run_dir, enabled=env.is_main, tensorboard=config.report_to_tensorboard)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config.save_yaml(run_dir / "config.yaml")
        ckpt.clean_stale_tmp(run_dir / "checkpoints")
        ckpt.clean_stale_tmp(run_dir)

    # -- banner (the seed's, plus what a reader needs to repeat the run)
    say("=" * 60)
    say("DDP TRAINING CONFIGURATION" if use_ddp else "TRAINING CONFIGURATION")
    say("=" * 60)
    say(f"World size:           {W} ({env.backend or 'no process group'})")
    say(f"Batch size per device: {B}")
    say(f"Gradient accumulation: {GA}")
    say(f"Effective batch size: {B * GA * W}")
    say(f"Learning rate:        {config.learning_rate:g}")
    say(f"Epochs:               {config.num_train_epochs:g} ({total_steps} optimizer steps)")
    say(f"Device:               {env.device}" + (f" x{torch.get_num_threads()} threads" if env.device.type == "cpu" else ""))
    say(f"Precision:            {'bf16 autocast' if config.bf16 else 'fp16 autocast + GradScaler' if config.fp16 else 'fp32'}")
    say(f"Model:                {config.model_name_or_path} ({count_parameters(raw_model) / 1e6:.1f}M parameters)")
    say(f"Train samples:        {len(data.train):,} (each process sees {len(sampler):,})")
    say(f"Test samples:         {len(data.test):,}")
    if resume_from is not None:
        say(f"Resumed from:         {resume_from} (step {state['global_step']})")
    say("=" * 60)

    def save_checkpoint() -> None:
        rng_states = all_gather_object(ckpt.capture_rng_state(), env)  # every rank: a collective
        if env.is_main:
            trainer_state = {**state, "world_size": W, "per_device_train_batch_size": B, "gradient_accumulation_steps": GA}
            ckpt.save_resumable(run_dir / "checkpoints", state["global_step"], raw_model, optimizer, scheduler, scaler,
                                trainer_state, rng_states, config.to_dict())
            ckpt.rotate_checkpoints(run_dir / "checkpoints", config.save_total_limit)

    def evaluate_and_keep_best(epoch_float: float) -> dict[str, Any]:
        metrics = evaluate(raw_model, data.test, env, config)
        state["last_eval"] = metrics
        logger.log("eval", state["global_step"], {"epoch": round(epoch_float, 4), **metrics})
        best = state["best_accuracy"]
        if best is None or metrics["accuracy"] > best:
            state["best_accuracy"] = metrics["accuracy"]
            if env.is_main:
                ckpt.save_servable(run_dir / "best", raw_model, data.tokenizer, {
                    "metrics": metrics, "epoch": epoch_float, "global_step": state["global_step"],
                    "max_length": config.max_length, "model_name": config.model_name_or_path,
                    "training_config": config.to_dict(), "world_size": W,
                })
        return metrics

    # -- the loop
    model.train()
    shape, peak = ModelShape.of(raw_model), peak_for(env.device, config.bf16, config.fp16)
    say(f"MFU peak:             {peak.source}")
    progress = tqdm(total=total_steps, initial=state["global_step"], disable=not env.is_main or config.disable_tqdm,
                    desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)
    # loss sum, correct, samples, real tokens, sum of squared lengths (attention FLOPs) since the last log
    window = torch.zeros(5, dtype=torch.float64, device=env.device)
    history: list[dict[str, Any]] = []
    start_epoch = state["epoch"]
    window_started = time.perf_counter()
    for epoch in range(start_epoch, num_epochs):
        if state["global_step"] >= total_steps:
            break
        skip_micro = state["step_in_epoch"] * GA if epoch == start_epoch else 0
        sampler.set_epoch(epoch, skip=skip_micro * B)
        loader = DataLoader(data.train, batch_size=B, sampler=sampler, collate_fn=Collator(data.train.pad_token_id),
                            num_workers=config.dataloader_num_workers, pin_memory=env.device.type == "cuda",
                            # Its own generator: an iterator draws a seed, which must not shift the global
                            # RNG that dropout uses (a resumed run would otherwise diverge).
                            generator=torch.Generator().manual_seed(config.seed + epoch))
        epoch_totals = torch.zeros(5, dtype=torch.float64, device=env.device)  # as ``window``
        epoch_started = time.perf_counter()
        state["epoch"] = epoch
        if epoch != start_epoch:
            state["step_in_epoch"] = 0
        for i, batch in enumerate(loader, start=skip_micro):
            window_start = (i // GA) * GA
            micro_in_window = min(GA, micro_per_epoch - window_start)
            is_step = i - window_start == micro_in_window - 1
            batch = {k: v.to(env.device, non_blocking=True) for k, v in batch.items()}
            # Gradients all-reduce only on the micro-step that ends an accumulation window.
            sync = contextlib.nullcontext() if (is_step or not use_ddp) else model.no_sync()
            with sync:
                with autocast_context(config, env.device):
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                loss = F.cross_entropy(logits.float(), batch["labels"])
                scaled = loss / micro_in_window
                (scaler.scale(scaled) if scaler else scaled).backward()
            with torch.no_grad():
                n = batch["labels"].numel()
                stats = torch.cat([torch.stack([loss.detach().double() * n, (logits.argmax(-1) == batch["labels"]).sum().double(),
                                                torch.tensor(float(n), dtype=torch.float64, device=env.device)]),
                                   batch_length_stats(batch["attention_mask"])])
                window += stats
                epoch_totals += stats
            if not is_step:
                continue

            if scaler:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), config.max_grad_norm) if config.max_grad_norm > 0 else None
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["global_step"] += 1
            state["step_in_epoch"] += 1
            progress.update(1)
            step = state["global_step"]
            epoch_float = epoch + state["step_in_epoch"] / steps_per_epoch

            if step % config.logging_steps == 0:
                all_reduce_sum(window, env)
                loss_avg, acc = (window[0] / window[2]).item(), (window[1] / window[2]).item()
                values = {"epoch": round(epoch_float, 4), "loss": loss_avg, "accuracy": acc, "learning_rate": scheduler.get_last_lr()[0]}
                values.update(_speed(window, time.perf_counter() - window_started, shape, peak.flops, W))
                if grad_norm is not None:
                    values["grad_norm"] = float(grad_norm)
                logger.log("train", step, values)
                progress.set_postfix(loss=f"{loss_avg:.4f}", lr=f"{values['learning_rate']:.2e}")
                window.zero_()
                window_started = time.perf_counter()
            paused = time.perf_counter()
            if config.eval_steps and step % config.eval_steps == 0 and step < total_steps:
                evaluate_and_keep_best(epoch_float)
            if config.save_steps and step % config.save_steps == 0 and step < total_steps:
                save_checkpoint()
            window_started += time.perf_counter() - paused  # the logged rates count training time only
            if step >= total_steps:
                break

        # -- end of epoch (or of training): exact eval, summary, checkpoint
        paused = time.perf_counter()
        epoch_time = paused - epoch_started
        all_reduce_sum(epoch_totals, env)
        train_loss, train_acc = (epoch_totals[0] / epoch_totals[2].clamp(min=1)).item(), (epoch_totals[1] / epoch_totals[2].clamp(min=1)).item()
        speed = _speed(epoch_totals, epoch_time, shape, peak.flops, W)
        finished_epoch = state["step_in_epoch"] >= steps_per_epoch
        epoch_float = epoch + state["step_in_epoch"] / steps_per_epoch
        metrics = evaluate_and_keep_best(epoch_float)
        summary = {"epoch": round(epoch_float, 4), "train_loss": train_loss, "train_accuracy": train_acc,
                   "test_loss": metrics["loss"], "test_accuracy": metrics["accuracy"], "test_macro_f1": metrics["macro_f1"],
                   "epoch_time_s": epoch_time, **speed}
        history.append(summary)
        logger.log("epoch", state["global_step"], summary)
        progress.clear()
        say(f"\nEpoch [{epoch + 1}/{num_epochs}] - {_fmt_time(epoch_time)}")
        say(f"  Train Loss: {train_loss:.4f} | Train Acc: {100 * train_acc:.2f}%")
        say(f"  Test Loss:  {metrics['loss']:.4f} | Test Acc:  {100 * metrics['accuracy']:.2f}% | Macro-F1: {100 * metrics['macro_f1']:.2f}%")
        say(f"  Throughput: {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s, MFU {100 * summary['mfu']:.1f}%")
        if finished_epoch:
            state["epoch"], state["step_in_epoch"] = epoch + 1, 0
        save_checkpoint()
        window_started += time.perf_counter() - paused
    progress.close()

    total_time = time.perf_counter() - started
    result = {"output_dir": str(run_dir), "global_step": state["global_step"], "best_accuracy": state["best_accuracy"],
              "final_eval": state["last_eval"], "total_time_s": total_time, "epochs": history}
    logger.log("summary", state["global_step"], {"total_time_s": total_time, "best_accuracy": state["best_accuracy"]})
    logger.close()
    say("=" * 60)
    say("TRAINING COMPLETE")
    say("=" * 60)
    say(f"Total time: {_fmt_time(total_time)}")
    if state["best_accuracy"] is not None:
        say(f"Best test accuracy: {100 * state['best_accuracy']:.2f}%")
    say(f"Checkpoint saved to: {run_dir / 'best'}")
    return result


def _speed(totals: torch.Tensor, seconds: float, shape: ModelShape, peak_flops: float, world_size: int) -> dict[str, float]:
    """samples/s, tokens/s (real tokens) and MFU from all-reduced [.., .., samples, tokens, sum len^2] counts."""
    samples, tokens, squares = (float(x) for x in totals[2:5].tolist())
    if seconds <= 0:
        return {"samples_per_s": 0.0, "tokens_per_s": 0.0, "mfu": 0.0}
    return {"samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds,
            "mfu": mfu(shape.train_flops(tokens, squares), seconds, peak_flops, world_size)}


def _no_buffer_sync() -> dict[str, bool]:
    """BERT's buffers (position ids) are constants: syncing them costs a collective per forward."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # torch >= 2.13 spelling
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m}m {s}s" if h else f"{m}m {s}s"

"""The training loop, one code path for 1 and N processes. Read it top to bottom.

    train(config)          join the process group torchrun describes, run a Trainer, leave it
    Trainer.__init__       set up: data, model wrapped for the strategy, optimizer, schedule, logs
    Trainer.train          resume, banner, then per epoch: train_step, log, evaluate, save
    Trainer.train_step     one optimizer step over a window of micro-batches (gradient accumulation)

Only rank 0 prints, shows the progress bar, writes logs and saves; every rank reaches every
collective (metric sums, RNG and state-dict gathering), and none of them sits inside
``if is_main``. A checkpoint is the last thing written for its step, after that step's log,
evaluation and best model, so a run resumed from it continues exactly as if never stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..checkpoint.manifest import resolve_resume
from ..checkpoint.records import RunningCounts, ServableInfo, TrainerStateRecord
from ..checkpoint.resumable import Checkpointer, restore_rng_state
from ..checkpoint.rundir import RunDir
from ..checkpoint.servable import save_servable
from ..checkpoint.space import saving_together, space_needed
from ..config import TrainConfig
from ..data.collate import Collator
from ..data.sampler import TrainSampler
from ..data.splits import load_split, stratified_sample
from ..data.tokenized import TokenizedDataset, tokenize_cached
from ..distributed.parallel import ParallelModel, wrap_model
from ..distributed.preemption import StopRequest
from ..distributed.process_group import DistEnv, all_reduce_max, broadcast_object, distributed_context, main_process_first
from ..distributed.watchdog import Watchdog
from ..model import add_lora, build_model, build_tokenizer, count_parameters, forward_loss, freeze_word_embeddings, merged
from .curves import write_training_curves
from .dropout import use_fast_dropout
from .evaluation import evaluate
from .flops import ModelShape, peak_for, throughput
from .metrics import Counts, MetricsLogger
from .precision import Precision, check_precision_supported


def train(config: TrainConfig) -> dict[str, Any]:
    check_precision_supported(config)
    # The process group's own timeout is a backstop behind the watchdog, which names the silent rank.
    with (
        distributed_context(timeout_s=config.ddp_timeout + 60) as env,
        StopRequest(env) as stop,
        Watchdog(env, config.ddp_timeout) as watchdog,
    ):
        trainer = Trainer(config, env, stop)
        watchdog.progress = lambda: trainer.state.global_step  # what a silent rank last reported
        return trainer.train()


# ---------------------------------------------------------------------- state
@dataclass
class TrainState:
    """Where the run is: what a checkpoint must hold to continue it exactly."""

    global_step: int = 0
    epoch: int = 0  # the epoch in progress, or the next one once an epoch has closed
    step_in_epoch: int = 0  # optimizer steps done in ``epoch``
    best_accuracy: float | None = None
    last_eval: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, state[f.name])


@dataclass(frozen=True)
class StepPlan:
    """How the rows divide into micro-batches and optimizer steps."""

    micro_batch: int  # rows per forward pass on one rank
    accumulation: int  # micro-batches per optimizer step
    micro_per_epoch: int
    steps_per_epoch: int
    total_steps: int

    @classmethod
    def of(cls, config: TrainConfig, rows_per_rank: int) -> StepPlan:
        micro = math.ceil(rows_per_rank / config.per_device_train_batch_size)
        per_epoch = math.ceil(micro / config.gradient_accumulation_steps)
        total = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * per_epoch)
        return cls(config.per_device_train_batch_size, config.gradient_accumulation_steps, micro, per_epoch, total)

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.total_steps / self.steps_per_epoch)


class TrainClock:
    """Seconds spent training: evaluation and saving are paused out, so logged rates count training only."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._paused = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self._started - self._paused

    def pause(self) -> _Pause:
        return _Pause(self)


class _Pause:
    def __init__(self, clock: TrainClock):
        self.clock = clock

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.clock._paused += time.perf_counter() - self.t0


@dataclass
class Datasets:
    train: TokenizedDataset | None
    test: TokenizedDataset
    tokenizer: Any


def prepare_data(config: TrainConfig, env: DistEnv, need_train: bool = True) -> Datasets:
    """Read, sample and tokenize; each node's first process builds the token cache, the others read it."""
    tokenizer = build_tokenizer(config.model_name_or_path)
    splits: dict[str, TokenizedDataset] = {}
    with main_process_first(env, local=True):
        for name, limit in (("train", config.train_samples), ("test", config.eval_samples)):
            if name == "train" and not need_train:
                continue
            raw = load_split(config.data_dir, name)
            raw = raw.subset(stratified_sample(raw.labels, limit, config.seed))
            splits[name] = tokenize_cached(raw, tokenizer, config.max_length, config.cache_dir, build=env.is_local_main)
    return Datasets(splits.get("train"), splits["test"], tokenizer)


def build_optimizer(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm weights; one fused kernel for the whole update."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.learning_rate, fused=device.type in ("cpu", "cuda"))


def linear_schedule_with_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Hugging Face's ``get_linear_schedule_with_warmup``, the same multipliers step for step.

    Written out because importing it from transformers pulls in its Trainer's utilities (and
    peft where installed): seconds of start-up in every worker, for a two-line rule.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_windows(batches: Iterable[dict[str, torch.Tensor]], accumulation: int) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Group micro-batches into optimizer steps; an epoch's last window may be shorter."""
    window: list[dict[str, torch.Tensor]] = []
    for batch in batches:
        window.append(batch)
        if len(window) == accumulation:
            yield window
            window = []
    if window:
        yield window


# ---------------------------------------------------------------------- the trainer
class Trainer:
    def __init__(self, config: TrainConfig, env: DistEnv, stop: StopRequest | None = None):
        self.config, self.env = config, env
        self.stop = stop or StopRequest(env)  # SIGTERM: stop at a step boundary with a checkpoint
        self.run_dir = RunDir(config.output_dir)
        self.say = print if env.is_main else (lambda *a, **k: None)
        if not env.is_main:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # one copy of the library's warnings, from rank 0

        self.data = prepare_data(config, env)
        # The sampler deals out whole optimizer steps (batch x accumulation rows a rank), so the rows
        # of step k are the same however they are split into processes and micro-batches.
        rows_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
        self.sampler = TrainSampler(self.data.train, env.world_size, env.rank, rows_per_step, config.seed, config.group_by_length)
        self.plan = StepPlan.of(config, len(self.sampler))

        self.precision = Precision.from_config(config, env.device)
        model = build_model(config.model_name_or_path, dropout=config.dropout, seed=config.seed, attention_dropout=config.attention_dropout)
        if config.freeze_word_embeddings:
            freeze_word_embeddings(model)
        if config.fast_dropout and env.device.type == "cpu":
            use_fast_dropout(model)
        if config.use_peft:
            model = add_lora(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
        model = model.to(env.device)
        self.model: ParallelModel = wrap_model(model, config, env, param_dtype=self.precision.dtype)
        if config.torch_compile:  # what forward and backward run through; checkpoints read the raw model
            self.model.module = torch.compile(self.model.module, dynamic=config.pad_to_multiple_of is None)
        self.optimizer = build_optimizer(self.model.raw, config, env.device)
        warmup = math.ceil(config.warmup_ratio * self.plan.total_steps)
        self.scheduler = linear_schedule_with_warmup(self.optimizer, warmup, self.plan.total_steps)
        self.scaler = self.precision.grad_scaler()

        self.state = TrainState()
        self.checkpointer = Checkpointer(self.run_dir.checkpoints, env, config.save_total_limit, config.to_dict())
        self.shape = ModelShape.of(self.model.raw)
        self.peak = peak_for(env.device, self.precision.compute_dtype)
        self.window_counts = Counts(env.device)  # since the last log line
        self.epoch_counts = Counts(env.device)  # since the epoch started
        self.clock = TrainClock()
        self.window_started = 0.0
        self.last_saved_step: int | None = None
        self.started = time.perf_counter()
        self.logger: MetricsLogger | None = None
        self.progress: Any = None

    # ------------------------------------------------------------------ the story
    def train(self) -> dict[str, Any]:
        resumed_from = self.resume()
        self.open_logs(resumed_from)
        self.print_banner(resumed_from)
        self.model.train()
        self.clock, self.window_started = TrainClock(), 0.0
        history: list[dict[str, Any]] = []
        for epoch in range(self.state.epoch, self.plan.num_epochs):
            if self.done or self.stop.agreed():
                break
            epoch_clock = self.clock.elapsed()
            self.train_epoch(epoch)
            if self.stop.stopped and not (self.epoch_complete or self.done):
                self.save()  # stopped mid-epoch: a checkpoint of this step (unless one was just written)
                break
            history.append(self.end_epoch(epoch, self.clock.elapsed() - epoch_clock))
        return self.finish(history)

    def train_epoch(self, epoch: int) -> None:
        """Optimizer steps until the epoch ends, training is done, or the ranks agree to stop."""
        for window in optimizer_windows(self.epoch_batches(epoch), self.plan.accumulation):
            grad_norm = self.train_step(window)
            self.state.global_step += 1
            self.state.step_in_epoch += 1
            self.progress.update(1)
            if self.state.global_step % self.config.logging_steps == 0:
                self.log_train(grad_norm)
            if self.epoch_complete or self.done:
                return  # the epoch's end evaluates and saves this step
            self.evaluate_and_save_if_due()
            if self.stop.agreed():
                return

    def train_step(self, window: list[dict[str, torch.Tensor]]) -> torch.Tensor | None:
        """One optimizer step: forward and backward over the window's micro-batches, then the update."""
        self.forward_backward(window)
        return self.optimizer_step()

    def forward_backward(self, window: list[dict[str, torch.Tensor]], sync: bool = True) -> None:
        """Accumulate the window's gradients; they are all-reduced on its last micro-batch (if ``sync``)."""
        for i, batch in enumerate(window):
            batch = {k: v.to(self.env.device, non_blocking=True) for k, v in batch.items()}
            with self.model.sync_gradients(sync and i == len(window) - 1):
                loss, logits = forward_loss(self.model, batch, self.precision.autocast)
                scaled = loss / len(window)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            counts = Counts.of_batch(loss, logits, batch)
            self.window_counts += counts
            self.epoch_counts += counts

    def optimizer_step(self) -> torch.Tensor | None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self.model.clip_grad_norm_(self.config.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ------------------------------------------------------------------ where the run is
    @property
    def done(self) -> bool:
        return self.state.global_step >= self.plan.total_steps

    @property
    def epoch_complete(self) -> bool:
        return self.state.step_in_epoch >= self.plan.steps_per_epoch

    @property
    def epoch_float(self) -> float:
        return self.state.epoch + self.state.step_in_epoch / self.plan.steps_per_epoch

    def epoch_batches(self, epoch: int) -> DataLoader:
        """This rank's micro-batches of ``epoch``, after the ones a resumed run has already trained on."""
        if self.state.epoch != epoch:
            self.state.epoch, self.state.step_in_epoch = epoch, 0
        skip_rows = self.state.step_in_epoch * self.plan.accumulation * self.plan.micro_batch
        self.sampler.set_epoch(epoch, skip=skip_rows)
        return DataLoader(
            self.data.train,
            batch_size=self.plan.micro_batch,
            sampler=self.sampler,
            collate_fn=Collator(self.data.train.pad_token_id, self.config.pad_to_multiple_of),
            num_workers=self.config.dataloader_num_workers,
            pin_memory=self.env.device.type == "cuda",
            # Its own generator: an iterator draws a seed, which must not shift the global RNG
            # that dropout uses (a resumed run would otherwise diverge).
            generator=torch.Generator().manual_seed(self.config.seed + epoch),
        )

    # ------------------------------------------------------------------ setup steps
    def resume(self) -> str | None:
        # Rank 0 verifies the checkpoint files (and says what it skips); every rank takes its choice.
        chosen = resolve_resume(self.config.resume_from_checkpoint, self.run_dir.checkpoints) if self.env.is_main else None
        path = broadcast_object(chosen, self.env)
        if path is None:
            torch.manual_seed(self.config.seed + self.env.rank)  # dropout differs across ranks, repeatably
            return None
        saved = self.checkpointer.load(path, self.model, self.optimizer, self.scheduler, self.scaler)
        self.state.load_state_dict(asdict(saved.trainer_state))
        running = saved.trainer_state.running_counts
        if running and self.env.is_main:
            self.window_counts = Counts.from_list(running.window, self.env.device)
            self.epoch_counts = Counts.from_list(running.epoch, self.env.device)
        if saved.world_size != self.env.world_size:
            self.say(
                f"warning: checkpoint was written with {saved.world_size} processes, resuming with "
                f"{self.env.world_size}: data order differs from an uninterrupted run"
            )
        restore_rng_state(saved.rng_states[self.env.rank % len(saved.rng_states)])
        if self.epoch_complete:  # written on an epoch's last step before that epoch closed (older runs)
            self.state.epoch, self.state.step_in_epoch = self.state.epoch + 1, 0
        return str(path)

    def open_logs(self, resumed_from: str | None) -> None:
        if self.env.is_main:
            self.run_dir.prepare(self.config, resumed=resumed_from is not None)
        self.logger = MetricsLogger(
            self.run_dir,
            enabled=self.env.is_main,
            tensorboard=self.config.report_to_tensorboard,
            resume_step=self.state.global_step if resumed_from else None,
        )
        self.progress = tqdm(
            total=self.plan.total_steps,
            initial=self.state.global_step,
            desc="train",
            unit="step",
            disable=not self.env.is_main or self.config.disable_tqdm,
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def print_banner(self, resumed_from: str | None) -> None:
        c, env, say = self.config, self.env, self.say
        per_step = c.per_device_train_batch_size * c.gradient_accumulation_steps * env.world_size
        threads = f" x{torch.get_num_threads()} threads" if env.device.type == "cpu" else ""
        say("=" * 60)
        say(
            "DDP TRAINING CONFIGURATION"
            if self.model.replicated
            else "FSDP TRAINING CONFIGURATION"
            if self.model.sharded
            else "TRAINING CONFIGURATION"
        )
        say("=" * 60)
        say(f"World size:           {env.world_size} ({env.backend or 'no process group'}, strategy {self.model.strategy})")
        say(f"Batch size per device: {c.per_device_train_batch_size}")
        say(f"Gradient accumulation: {c.gradient_accumulation_steps}")
        say(f"Effective batch size: {per_step}")
        say(f"Learning rate:        {c.learning_rate:g}")
        say(f"Epochs:               {c.num_train_epochs:g} ({self.plan.total_steps} optimizer steps)")
        say(f"Device:               {env.device}{threads}")
        say(f"Precision:            {self.precision.name}")
        total, trainable = count_parameters(self.model.raw), count_parameters(self.model.raw, trainable_only=True)
        say(f"Model:                {c.model_name_or_path} ({total / 1e6:.1f}M parameters)")
        say(f"Trainable:            {trainable:,} parameters ({100 * trainable / total:.2f}%)" + (" with LoRA" if c.use_peft else ""))
        say(f"Communication a step: {self.model.communication()}")
        say(f"Train samples:        {len(self.data.train):,} (each process sees {len(self.sampler):,})")
        say(f"Test samples:         {len(self.data.test):,}")
        say(f"MFU peak:             {self.peak.source}")
        if resumed_from is not None:
            say(f"Resumed from:         {resumed_from} (step {self.state.global_step})")
        say("=" * 60)

    # ------------------------------------------------------------------ log, evaluate, save
    def log_train(self, grad_norm: torch.Tensor | None) -> None:
        counts = self.window_counts.all_reduced(self.env)  # every rank: a collective
        values = {
            "epoch": round(self.epoch_float, 4),
            "loss": counts.loss,
            "accuracy": counts.accuracy,
            "learning_rate": self.scheduler.get_last_lr()[0],
        }
        values.update(throughput(counts, self.clock.elapsed() - self.window_started, self.shape, self.peak.flops, self.env.world_size))
        if grad_norm is not None:
            values["grad_norm"] = float(grad_norm)
        self.logger.log("train", self.state.global_step, values)
        self.progress.set_postfix(loss=f"{counts.loss:.4f}", lr=f"{values['learning_rate']:.2e}")
        self.window_counts = Counts(self.env.device)
        self.window_started = self.clock.elapsed()

    def evaluate_and_save_if_due(self) -> None:
        step, c = self.state.global_step, self.config
        with self.clock.pause():
            if c.eval_steps and step % c.eval_steps == 0:
                self.evaluate()
            if c.save_steps and step % c.save_steps == 0:
                self.save()

    def evaluate(self) -> dict[str, Any]:
        """Exact metrics on the test split (every rank scores its share); keeps the best model in ``best/``."""
        metrics = evaluate(
            self.model.raw,
            self.data.test,
            self.env,
            self.config.per_device_eval_batch_size,
            self.precision,
            progress=self.env.is_main and not self.config.disable_tqdm,
            lockstep=self.model.sharded,
        )
        self.state.last_eval = metrics
        self.logger.log("eval", self.state.global_step, {"epoch": round(self.epoch_float, 4), **metrics})
        best = self.state.best_accuracy
        if best is None or metrics["accuracy"] > best:
            self.state.best_accuracy = metrics["accuracy"]
            weights = self.model.full_state_dict()  # every rank: a collective under sharded strategies
            target = self.run_dir.best
            with saving_together(
                self.env, target, self.run_dir.checkpoints, lambda: space_needed(target if target.is_dir() else None, weights)
            ):
                if self.env.is_main:
                    servable = merged(self.model.raw)  # LoRA folded in: best/ loads without peft
                    save_servable(
                        target,
                        servable,
                        servable.state_dict() if servable is not self.model.raw else weights,
                        self.data.tokenizer,
                        ServableInfo(
                            metrics=metrics,
                            epoch=self.epoch_float,
                            global_step=self.state.global_step,
                            max_length=self.config.max_length,
                            model_name=self.config.model_name_or_path,
                            training_config=self.config.to_dict(),
                            world_size=self.env.world_size,
                        ),
                    )
        return metrics

    def save(self) -> None:
        if self.last_saved_step == self.state.global_step:
            return
        self.last_saved_step = self.state.global_step
        # The running sums of the current log window and epoch, summed over ranks (collectives): a resumed
        # run logs the same averages. Rank 0 takes them back; the other ranks start from zero.
        running = RunningCounts(
            window=self.window_counts.all_reduced(self.env).values.tolist(),
            epoch=self.epoch_counts.all_reduced(self.env).values.tolist(),
        )
        self.checkpointer.save(
            self.state.global_step,
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            TrainerStateRecord(
                **self.state.state_dict(),
                running_counts=running,
                per_device_train_batch_size=self.config.per_device_train_batch_size,
                gradient_accumulation_steps=self.config.gradient_accumulation_steps,
            ),
        )

    def end_epoch(self, epoch: int, train_seconds: float) -> dict[str, Any]:
        """Epoch summary (the seed's lines), exact evaluation, then the checkpoint that closes the epoch."""
        with self.clock.pause():
            totals = self.epoch_counts.all_reduced(self.env)
            self.epoch_counts = Counts(self.env.device)
            metrics = self.evaluate()
            summary = {
                "epoch": round(self.epoch_float, 4),
                "train_loss": totals.loss,
                "train_accuracy": totals.accuracy,
                "test_loss": metrics["loss"],
                "test_accuracy": metrics["accuracy"],
                "test_macro_f1": metrics["macro_f1"],
                "epoch_time_s": train_seconds,
                "peak_memory_mib": peak_memory_mib(self.env),
                **throughput(totals, train_seconds, self.shape, self.peak.flops, self.env.world_size),
            }
            self.logger.log("epoch", self.state.global_step, summary)
            self.progress.clear()
            self.say(f"\nEpoch [{epoch + 1}/{self.plan.num_epochs}] - {_fmt_time(train_seconds)}")
            self.say(f"  Train Loss: {totals.loss:.4f} | Train Acc: {100 * totals.accuracy:.2f}%")
            self.say(
                f"  Test Loss:  {metrics['loss']:.4f} | Test Acc:  {100 * metrics['accuracy']:.2f}% | "
                f"Macro-F1: {100 * metrics['macro_f1']:.2f}%"
            )
            self.say(
                f"  Throughput: {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s, "
                f"MFU {100 * summary['mfu']:.1f}%, peak memory {summary['peak_memory_mib']:.0f} MiB a process"
            )
            if self.epoch_complete:
                self.state.epoch, self.state.step_in_epoch = epoch + 1, 0
            self.save()
        return summary

    def finish(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        self.progress.close()
        total_time = time.perf_counter() - self.started
        result = {
            "output_dir": str(self.run_dir.path),
            "global_step": self.state.global_step,
            "best_accuracy": self.state.best_accuracy,
            "final_eval": self.state.last_eval,
            "total_time_s": total_time,
            "epochs": history,
            "stopped_by": self.stop.reason if self.stop.stopped else None,
        }
        if self.stop.stopped:  # not finished: nothing in log.jsonl, which the resumed run continues
            self.logger.close()
            if self.last_saved_step is not None:
                saved = f"checkpoint {self.run_dir.checkpoints / f'step-{self.last_saved_step}'}; continue with --resume auto"
            else:
                saved = "no step trained in this run, nothing saved"
            self.say(f"\nStopped by {self.stop.reason} at step {self.state.global_step} of {self.plan.total_steps}: {saved}.")
            return result
        digests = self.model.replica_digests() if self.model.replicated else []
        if digests:
            same = len(set(digests)) == 1
            self.say(f"Replicas: {'identical' if same else 'DIFFERENT'} parameters on the {len(digests)} ranks ({', '.join(digests)})")
            result["replicas_identical"] = same
        self.logger.log(
            "summary",
            self.state.global_step,
            {
                "total_time_s": total_time,
                "best_accuracy": self.state.best_accuracy,
                **({"replicas_identical": result["replicas_identical"]} if digests else {}),
            },
        )
        self.logger.close()
        self.say("=" * 60)
        self.say("TRAINING COMPLETE")
        self.say("=" * 60)
        self.say(f"Total time: {_fmt_time(total_time)}")
        if self.state.best_accuracy is not None:
            self.say(f"Best test accuracy: {100 * self.state.best_accuracy:.2f}%")
        self.say(f"Checkpoint saved to: {self.run_dir.best}")
        if self.env.is_main and self.config.save_training_curves:
            write_training_curves(self.run_dir, self.say)  # training_curves.png from the finished log
        return result


def peak_memory_mib(env: DistEnv) -> float:
    """The largest peak memory of any rank (a collective): resident set on CPU, allocated on CUDA."""
    import resource

    if env.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(env.device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return float(all_reduce_max(torch.tensor([peak], dtype=torch.float64, device=env.device), env).item())


def _fmt_time(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m}m {s}s" if h else f"{m}m {s}s"

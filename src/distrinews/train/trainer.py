"""The training loop, one code path for 1 and N processes. Read it top to bottom.

    train(config)          join the process group torchrun describes, run a Trainer, leave it
    Trainer.__init__       its parts, one builder each (``build.py``): data, model, precision, parallelism,
                           optimizer and schedule, checkpoints, callbacks
    Trainer.train          resume, banner, then per epoch: train_step, log, evaluate, save
    Trainer.train_step     one optimizer step over a window of micro-batches (gradient accumulation)

Each part's decisions (the calibration hold-out, distillation, the compile cast, EMA, class weights)
are in its builder; what it prints is ``console.py``; ``best/`` is kept by ``checkpoint/best.py`` and
the resumable checkpoints by ``checkpoint/resumable.py``. Only rank 0 prints, shows the progress bar, writes
logs and saves; every rank reaches every collective (metric sums, RNG and state-dict
gathering), and none of them sits inside ``if is_main``. A checkpoint is the last thing written
for its step, after that step's log, evaluation and best model, so a run resumed from it
continues exactly as if never stopped.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..checkpoint.best import improves
from ..checkpoint.manifest import resolve_resume
from ..checkpoint.records import RunningCounts, TrainState, read_trainer_state
from ..checkpoint.resumable import restore_rng_state
from ..checkpoint.rundir import RunDir
from ..config import TrainConfig
from ..data.collate import Collator
from ..data.labelled import class_counts
from ..distributed.parallel import ParallelModel
from ..distributed.preemption import StopRequest
from ..distributed.process_group import DistEnv, broadcast_object, distributed_context
from ..distributed.watchdog import Watchdog
from ..errors import CheckpointError
from ..model import count_parameters, forward_loss
from .build import (
    OptimizerFactory,
    build_callbacks,
    build_checkpointing,
    build_config,
    build_data,
    build_model,
    build_optimization,
    build_parallel,
    build_precision,
    build_steps,
    check_precision_supported,
)
from .calibration import calibrate_run, summary_lines
from .callbacks import TrainerCallback
from .components import TrainClock, optimizer_windows, peak_memory_mib
from .console import Report, RunFacts, banner_lines, epoch_lines, final_lines, replicas_line, stopped_line
from .curves import write_confidence_plots, write_confusion_matrix, write_training_curves
from .evaluation import evaluate
from .flops import ModelShape, peak_for, throughput
from .metrics import Counts


def train(config: TrainConfig, callbacks: list[TrainerCallback] | None = None) -> dict[str, Any]:
    """``callbacks``: called after the config's own (``build_callbacks``), e.g. a tuner's trial reporter."""
    check_precision_supported(config.precision)
    # The process group's own timeout is a backstop behind the watchdog, which names the silent rank.
    with (
        distributed_context(timeout_s=config.parallel.ddp_timeout + 60) as env,
        StopRequest(env) as stop,
        Watchdog(env, config.parallel.ddp_timeout) as watchdog,
    ):
        trainer = Trainer(config, env, stop, callbacks=callbacks)
        watchdog.progress = lambda: trainer.state.global_step  # what a silent rank last reported
        return trainer.train()


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        stop: StopRequest | None = None,
        make_optimizer: OptimizerFactory | None = None,
        callbacks: list[TrainerCallback] | None = None,
    ):
        """``make_optimizer``: the optimizer for the raw model's parameters (default: ``build_optimizer``, fused AdamW);
        ``callbacks``: more callbacks, after the config's own."""
        config = build_config(config, env)
        self.config, self.env = config, env
        self.stop = stop or StopRequest(env)  # SIGTERM: stop at a step boundary with a checkpoint
        self.run_dir = RunDir(config.run.output_dir)
        self.report = Report(env, config.run.disable_tqdm)

        self.data, self.distillation = build_data(config, env, self.report.say)
        self.sampler, self.plan = build_steps(config, self.data, env)
        model = build_model(config, self.data.label_names, env.device)
        self.precision = build_precision(config.precision, model, env)
        self.model: ParallelModel = build_parallel(config, model, self.precision, env)
        self.optimizer, self.scheduler, self.average, self.class_weights = build_optimization(
            config.optimizer, self.model, self.data, self.plan.total_steps, env, make_optimizer
        )
        self.scaler = self.precision.grad_scaler()
        self.state = TrainState()
        self.checkpointer, self.best = build_checkpointing(config, self.run_dir, self.data, env)
        self.callbacks = build_callbacks(
            config, env, self.run_dir, self.state, self.report.say, self.data.eval_rows, extra=callbacks
        )
        self.control = self.callbacks.control

        self.shape = ModelShape.of(self.model.raw)
        self.peak = peak_for(env.device, self.precision.compute_dtype)
        self._window_counts = Counts(env.device)  # since the last log line
        self._epoch_counts = Counts(env.device)  # since the epoch started
        self.clock = TrainClock()
        self.window_started = 0.0
        self.last_saved_step: int | None = None
        self.started = time.perf_counter()
        self.best_eval: dict[str, Any] | None = None  # the evaluation best/ was kept for, in this process's run

    @property
    def window_counts(self) -> Counts:
        """This rank's loss and accuracy counts since the last log line (read-only; ``take_window_counts`` resets)."""
        return self._window_counts

    def take_window_counts(self) -> Counts:
        """This rank's counts since the last log line or call, and a fresh window from here."""
        counts, self._window_counts = self._window_counts, Counts(self.env.device)
        return counts

    # ------------------------------------------------------------------ the story
    def train(self) -> dict[str, Any]:
        resumed_from = self.resume()
        self.open_logs(resumed_from)
        self.print_banner(resumed_from)
        self.model.train()
        self.clock, self.window_started = TrainClock(), 0.0
        history: list[dict[str, Any]] = []
        for epoch in range(self.state.epoch, self.plan.num_epochs):
            if self.done or self.stop.agreed() or self.control.should_training_stop:
                break
            epoch_clock = self.clock.elapsed()
            self.train_epoch(epoch)
            if (self.stop.stopped or self.control.should_training_stop) and not (self.epoch_complete or self.done):
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
            self.report.progress.update(1)
            if self.state.global_step % self.config.run.logging_steps == 0:
                self.log_train(grad_norm)
            if self.epoch_complete or self.done:
                return  # the epoch's end evaluates and saves this step
            self.evaluate_and_save_if_due()
            if self.stop.agreed() or self.control.should_training_stop:
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
                loss, logits = forward_loss(
                    self.model,
                    batch,
                    self.precision.autocast,
                    class_weights=self.class_weights,
                    label_smoothing=self.config.optimizer.label_smoothing_factor,
                )
                if self.distillation is not None:  # the labels' loss mixed with the teacher's soft labels
                    loss = self.distillation.loss(loss, logits, batch)
                scaled = loss / len(window)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            counts = Counts.of_batch(loss, logits, batch)
            self._window_counts += counts
            self._epoch_counts += counts

    def optimizer_step(self) -> torch.Tensor | None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self.model.clip_grad_norm_(self.config.optimizer.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update()
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

    def epoch_batches(self, epoch: int) -> DataLoader[tuple[torch.Tensor, int | torch.Tensor, int]]:
        """This rank's micro-batches of ``epoch``, after the ones a resumed run has already trained on."""
        if self.state.epoch != epoch:
            self.state.epoch, self.state.step_in_epoch = epoch, 0
        skip_rows = self.state.step_in_epoch * self.plan.accumulation * self.plan.micro_batch
        self.sampler.set_epoch(epoch, skip=skip_rows)
        return DataLoader(
            self.data.train_set,
            batch_size=self.plan.micro_batch,
            sampler=self.sampler,
            collate_fn=Collator(self.data.train_set.pad_token_id, self.config.batches.pad_to_multiple_of),
            num_workers=self.config.batches.dataloader_num_workers,
            pin_memory=self.env.device.type == "cuda",
            # Its own generator: an iterator draws a seed, which must not shift the global RNG
            # that dropout uses (a resumed run would otherwise diverge).
            generator=torch.Generator().manual_seed(self.config.run.seed + epoch),
        )

    # ------------------------------------------------------------------ setup steps
    def resume(self) -> str | None:
        # Rank 0 verifies the checkpoint files (and says what it skips); every rank takes its choice.
        chosen = (
            resolve_resume(self.config.run.resume_from_checkpoint, self.run_dir.checkpoints)
            if self.env.is_main
            else None
        )
        path = broadcast_object(chosen, self.env)
        if path is None:
            torch.manual_seed(self.config.run.seed + self.env.rank)  # dropout differs across ranks, repeatably
            return None
        self.check_same_labels(read_trainer_state(Path(path)).label_names, path)  # before its weights meet this model
        saved = self.checkpointer.load(path, self.model, self.optimizer, self.scheduler, self.scaler, self.average)
        if self.average is not None and not saved.average_loaded:
            self.average.reset()
            self.report.say(
                f"warning: {path} holds no average of the weights (ema_decay): the average starts from its weights"
            )
        self.state.load_state_dict(saved.trainer_state.state_dict())
        running = saved.trainer_state.running_counts
        if running and self.env.is_main:
            self._window_counts = Counts.from_list(running.window, self.env.device)
            self._epoch_counts = Counts.from_list(running.epoch, self.env.device)
        if saved.world_size != self.env.world_size:
            self.report.say(
                f"warning: checkpoint was written with {saved.world_size} processes, resuming with "
                f"{self.env.world_size}: data order differs from an uninterrupted run"
            )
        restore_rng_state(saved.rng_states[self.env.rank % len(saved.rng_states)])
        return str(path)

    def check_same_labels(self, saved: list[str], path: str) -> None:
        """A checkpoint continues only the run of the same label set."""
        if saved != self.data.label_names:
            raise CheckpointError(
                f"{path}: trained on the labels {', '.join(saved)}, but this run's data has "
                f"{', '.join(self.data.label_names)}; resume it with the data it was trained "
                "on, or start a new run (another output_dir, or --overwrite_output_dir)"
            )

    def open_logs(self, resumed_from: str | None) -> None:
        if self.env.is_main:
            self.run_dir.prepare(self.config, resumed=resumed_from is not None)
        self.callbacks.on_train_begin(resumed_from, model=self.model.raw, total_steps=self.plan.total_steps)
        self.report.open_progress(self.plan.total_steps, self.state.global_step)

    def print_banner(self, resumed_from: str | None) -> None:
        raw = self.model.raw
        facts = RunFacts(
            strategy=self.model.strategy,
            title=self.model.title,
            communication=self.model.communication(),
            precision=self.precision.name,
            total_steps=self.plan.total_steps,
            parameters=count_parameters(raw),
            trainable=count_parameters(raw, trainable_only=True),
            train_rows=len(self.data.train_set),
            rows_per_rank=len(self.sampler),
            test_rows=len(self.data.test),
            label_names=self.data.label_names,
            train_counts=class_counts(self.data.train_rows, self.data.label_names),
            eval_counts=class_counts(self.data.eval_rows, self.data.label_names),
            eval_from=self.data.labelled.eval_from,
            class_weights=None if self.class_weights is None else self.class_weights.tolist(),
            mfu_peak=self.peak.source,
            calibration_rows=len(self.data.calibration_rows or ()),
        )
        self.report.say(*banner_lines(self.config, self.env, facts, resumed_from, self.state.global_step))

    # ------------------------------------------------------------------ log, evaluate, save
    def log_train(self, grad_norm: torch.Tensor | None) -> None:
        counts = self.take_window_counts().all_reduced(self.env)  # every rank: a collective
        values = {
            "epoch": round(self.epoch_float, 4),
            "loss": counts.loss,
            "accuracy": counts.accuracy,
            "learning_rate": self.scheduler.get_last_lr()[0],
        }
        values.update(
            throughput(
                counts, self.clock.elapsed() - self.window_started, self.shape, self.peak.flops, self.env.world_size
            )
        )
        if grad_norm is not None:
            values["grad_norm"] = float(grad_norm)
        self.callbacks.on_log("train", values)
        self.report.progress.set_postfix(loss=f"{counts.loss:.4f}", lr=f"{values['learning_rate']:.2e}")
        self.window_started = self.clock.elapsed()

    def evaluate_and_save_if_due(self) -> None:
        step, c = self.state.global_step, self.config.run
        with self.clock.pause():
            if c.eval_steps and step % c.eval_steps == 0:
                self.evaluate()
            if (c.save_steps and step % c.save_steps == 0) or self.control.should_save:
                self.save()

    def evaluate(self) -> dict[str, Any]:
        """Exact metrics on the test split (every rank scores its share); keeps the best model in ``best/``.
        With ``ema_decay``, of the average of the weights: what is evaluated is what best/ keeps."""
        with self.average.applied() if self.average is not None else contextlib.nullcontext():
            metrics: dict[str, Any] = evaluate(
                self.model.raw,
                self.data.test,
                self.env,
                self.config.batches.per_device_eval_batch_size,
                self.precision,
                progress=self.env.is_main and not self.config.run.disable_tqdm,
                lockstep=self.model.lockstep,
            )
            self.state.last_eval = metrics
            self.callbacks.on_log("eval", {"epoch": round(self.epoch_float, 4), **metrics})
            c, value = self.config.run, metrics[self.config.run.metric_for_best_model]
            improved = improves(value, self.state.best_metric, c.best_is_greater)
            self.callbacks.on_evaluate(metrics)  # early stopping compares with the best before this evaluation
            # load_best_model_at_end false: best/ follows the last evaluation, the model the run ends with
            if improved or not c.load_best_model_at_end:
                self.best.keep(self.model, metrics, self.epoch_float, self.state.global_step)
                self.state.best_accuracy, self.best_eval = metrics["accuracy"], metrics
            if improved:
                self.state.best_metric = value
        return metrics

    def save(self) -> None:
        if self.last_saved_step == self.state.global_step:
            return
        self.last_saved_step = self.state.global_step
        # The running sums of the current log window and epoch, summed over ranks (collectives): a resumed
        # run logs the same averages. Rank 0 takes them back; the other ranks start from zero.
        running = RunningCounts(
            window=self._window_counts.all_reduced(self.env).values.tolist(),
            epoch=self._epoch_counts.all_reduced(self.env).values.tolist(),
        )
        batches = self.config.batches
        record = self.state.model_copy(
            update={
                "running_counts": running,
                "per_device_train_batch_size": batches.per_device_train_batch_size,
                "gradient_accumulation_steps": batches.gradient_accumulation_steps,
                "label_names": list(self.data.label_names),
            }
        )
        step = self.state.global_step
        self.checkpointer.save(step, self.model, self.optimizer, self.scheduler, self.scaler, record, self.average)
        self.callbacks.on_save(self.run_dir.checkpoints / f"step-{step}")

    def end_epoch(self, epoch: int, train_seconds: float) -> dict[str, Any]:
        """Epoch summary (the seed's lines), exact evaluation, then the checkpoint that closes the epoch."""
        with self.clock.pause():
            totals = self._epoch_counts.all_reduced(self.env)
            self._epoch_counts = Counts(self.env.device)
            metrics = self.evaluate()
            summary = {
                "epoch": round(self.epoch_float, 4),
                "train_loss": totals.loss,
                "train_accuracy": totals.accuracy,
                "test_loss": metrics["loss"],
                "test_accuracy": metrics["accuracy"],
                "test_macro_f1": metrics["macro_f1"],
                **({"test_micro_f1": metrics["micro_f1"]} if "micro_f1" in metrics else {}),
                "epoch_time_s": train_seconds,
                "peak_memory_mib": peak_memory_mib(self.env),
                **throughput(totals, train_seconds, self.shape, self.peak.flops, self.env.world_size),
            }
            self.callbacks.on_log("epoch", summary)
            self.report.progress.clear()
            self.report.say(*epoch_lines(epoch, self.plan.num_epochs, train_seconds, totals, metrics, summary))
            if self.epoch_complete:
                self.state.epoch, self.state.step_in_epoch = epoch + 1, 0
            self.save()
        return summary

    def finish(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        self.report.close_progress()
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
            step = self.last_saved_step
            saved = None if step is None else str(self.run_dir.checkpoints / f"step-{step}")
            self.report.say(stopped_line(self.stop.reason, self.state.global_step, self.plan.total_steps, saved))
            self.callbacks.on_train_end(None, stopped_by=self.stop.reason)
            return result
        if digests := self.model.replica_digests():
            self.report.say(replicas_line(digests))
            result["replicas_identical"] = len(set(digests)) == 1
        # best/'s temperature (``calibration``) and the evaluation split's calibration error and coverage-accuracy,
        # from best/ as the server loads it: rank 0; the others wait in the summary's broadcast
        confidence = calibrate_run(self.run_dir.best, self.config, self.data, self.env, self.report.say)
        if confidence is not None:
            result["calibration"] = confidence.to_json()
        summary = ("total_time_s", "best_accuracy", "replicas_identical", "calibration")
        self.callbacks.on_log("summary", {k: result[k] for k in summary if k in result})
        best = self.best_eval or self.state.last_eval  # a resumed run that found no better model: its last evaluation
        self.report.say(*final_lines(total_time, self.state.best_accuracy, self.run_dir.best, best))
        if confidence is not None:
            self.report.say(*summary_lines(confidence, self.data.labelled.eval_from))
        if self.env.is_main and self.config.run.save_training_curves:
            write_training_curves(self.run_dir, self.report.say)  # training_curves.png from the finished log
            write_confusion_matrix(self.run_dir, best, self.report.say)
            if confidence is not None:
                write_confidence_plots(self.run_dir, confidence, self.report.say)
        self.callbacks.on_train_end(best)
        return result

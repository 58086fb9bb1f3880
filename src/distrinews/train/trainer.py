"""The training loop, one code path for 1 and N processes. Read it top to bottom.

    train(config)          join the process group torchrun describes, run a Trainer, leave it
    Trainer.__init__       set up: data, model wrapped for the strategy, optimizer, schedule, logs
    Trainer.train          resume, banner, then per epoch: train_step, log, evaluate, save
    Trainer.train_step     one optimizer step over a window of micro-batches (gradient accumulation)

The pieces it is built from are in ``components.py`` (each from its section of the config); what
it prints is ``console.py``; ``best/`` is kept by ``checkpoint/best.py`` and the resumable
checkpoints by ``checkpoint/resumable.py``. Only rank 0 prints, shows the progress bar, writes
logs and saves; every rank reaches every collective (metric sums, RNG and state-dict
gathering), and none of them sits inside ``if is_main``. A checkpoint is the last thing written
for its step, after that step's log, evaluation and best model, so a run resumed from it
continues exactly as if never stopped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch.utils.data import DataLoader

from ..checkpoint.best import BestModel, improves
from ..checkpoint.manifest import resolve_resume
from ..checkpoint.records import RunningCounts, TrainState, read_trainer_state
from ..checkpoint.resumable import Checkpointer, restore_rng_state
from ..checkpoint.rundir import RunDir
from ..config import MULTI_LABEL, TrainConfig
from ..data.collate import Collator
from ..data.labelled import class_counts, with_problem_type
from ..data.sampler import TrainSampler
from ..distributed.parallel import ParallelModel, wrap_model
from ..distributed.preemption import StopRequest
from ..distributed.process_group import DistEnv, broadcast_object, distributed_context, main_process_first
from ..distributed.watchdog import Watchdog
from ..errors import CheckpointError
from ..model import count_parameters, forward_loss
from .calibration import ConfidenceReport, calibrate_best, summary_lines, write_confidence_plots
from .callbacks import CallbackHandler, TrainerCallback, default_callbacks
from .components import (
    StepPlan,
    TrainClock,
    build_optimizer,
    build_train_model,
    class_weights,
    linear_schedule_with_warmup,
    optimizer_windows,
    peak_memory_mib,
    prepare_data,
    schedule_with_warmup,
)
from .console import Report, RunFacts, banner_lines, epoch_lines, final_lines, replicas_line, stopped_line
from .curves import write_confusion_matrix, write_training_curves
from .distillation import Distillation
from .ema import WeightAverage
from .evaluation import evaluate
from .flops import ModelShape, peak_for, throughput
from .metrics import Counts
from .precision import Precision, check_precision_supported

__all__ = [
    "StepPlan",
    "TrainState",
    "Trainer",
    "linear_schedule_with_warmup",
    "optimizer_windows",
    "prepare_data",
    "train",
]


def train(config: TrainConfig, callbacks: list[TrainerCallback] | None = None) -> dict[str, Any]:
    """``callbacks``: called after the config's own (``default_callbacks``), e.g. a tuner's trial reporter."""
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


OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]


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
        with main_process_first(env, local=True):  # a data set read once per node, the others from its cache
            config = with_problem_type(config)  # problem_type unset: from the data; the records say which
        self.config, self.env = config, env
        self.stop = stop or StopRequest(env)  # SIGTERM: stop at a step boundary with a checkpoint
        self.run_dir = RunDir(config.run.output_dir)
        self.report = Report(env, config.run.disable_tqdm)

        # calibration temperature: a share of the training rows is held out to fit it on (train/calibration.py)
        # (not for multi-label: temperature scaling is fitted to a softmax; per-label thresholds take its place)
        self.multi_label = config.data.problem_type == MULTI_LABEL
        temperature = config.run.calibration == "temperature" and not self.multi_label
        held_out = config.data.calibration_split_percentage if temperature else 0
        self.data = prepare_data(
            config.data, config.model.model_name_or_path, config.run.seed, env, calibration_percentage=held_out
        )
        # teacher_model_name_or_path: the teacher's probabilities of every training row, computed once and cached
        self.distillation = (
            Distillation.prepare(
                config.distillation,
                config.data.cache_dir,
                self.data.train_rows,
                self.data.label_names,
                env,
                self.report.say,
            )
            if config.distillation.teacher_model_name_or_path
            else None
        )
        # The sampler deals out whole optimizer steps (batch x accumulation rows a rank), so the rows
        # of step k are the same however they are split into processes and micro-batches.
        batches = config.batches
        rows_per_step = batches.per_device_train_batch_size * batches.gradient_accumulation_steps
        self.sampler = TrainSampler(
            self.data.train_set, env.world_size, env.rank, rows_per_step, config.run.seed, batches.group_by_length
        )
        self.plan = StepPlan.of(batches, len(self.sampler))

        model = build_train_model(
            config.model, config.run.seed, env.device, self.data.label_names, config.data.problem_type
        )
        self.precision = Precision.from_config(config.precision, env.device).prepare(model)
        self.model: ParallelModel = wrap_model(
            model, config.parallel, env, param_dtype=self.precision.dtype, run=config.run.output_dir
        )
        if config.model.torch_compile:  # what forward and backward run through; checkpoints read the raw model
            # torch's stub types the result as a function; compiling a module gives a module (an OptimizedModule)
            self.model.module = cast(
                torch.nn.Module, torch.compile(self.model.module, dynamic=config.batches.pad_to_multiple_of is None)
            )
        self.optimizer = (make_optimizer or (lambda m: build_optimizer(m, config.optimizer, env.device)))(
            self.model.raw
        )
        warmup = math.ceil(config.optimizer.warmup_ratio * self.plan.total_steps)
        self.scheduler = schedule_with_warmup(
            self.optimizer, config.optimizer.lr_scheduler_type, warmup, self.plan.total_steps
        )
        # ema_decay: evaluation, best/ and the served model use an average of the weights (train/ema.py)
        self.average = (
            WeightAverage(self.model.raw, config.optimizer.ema_decay) if config.optimizer.ema_decay > 0 else None
        )
        self.scaler = self.precision.grad_scaler()
        # class_weights balanced: each row's loss scaled by its class's weight (model.forward_loss)
        balanced = config.optimizer.class_weights == "balanced"
        self.class_weights = (
            class_weights(self.data.train_set, len(self.data.label_names), env.device) if balanced else None
        )

        self.state = TrainState()
        self.checkpointer = Checkpointer(
            self.run_dir.checkpoints, env, config.run.save_total_limit, config.to_dict(), tokenizer=self.data.tokenizer
        )
        self.best = BestModel(self.run_dir.best, self.run_dir.checkpoints, env, self.data.tokenizer, config.to_dict())
        self.shape = ModelShape.of(self.model.raw)
        self.peak = peak_for(env.device, self.precision.compute_dtype)
        self._window_counts = Counts(env.device)  # since the last log line
        self._epoch_counts = Counts(env.device)  # since the epoch started
        self.clock = TrainClock()
        self.window_started = 0.0
        self.last_saved_step: int | None = None
        self.started = time.perf_counter()
        # What observes or steers the run (the int8 model, log.jsonl, report_to's trackers, early stopping):
        # train/callbacks.py
        own = default_callbacks(config, env, self.run_dir, self.report.say, eval_rows=self.data.eval_rows)
        self.callbacks = CallbackHandler([*own, *(callbacks or [])], config, self.state, env)
        self.control = self.callbacks.control
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
            self.report.step_done()
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

    def epoch_batches(self, epoch: int) -> DataLoader:
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
        self.report.show(loss=f"{counts.loss:.4f}", lr=f"{values['learning_rate']:.2e}")
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
            metrics = evaluate(
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
        self.checkpointer.save(
            self.state.global_step,
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            self.state.model_copy(
                update={
                    "running_counts": running,
                    "per_device_train_batch_size": self.config.batches.per_device_train_batch_size,
                    "gradient_accumulation_steps": self.config.batches.gradient_accumulation_steps,
                    "label_names": list(self.data.label_names),
                }
            ),
            self.average,
        )
        self.callbacks.on_save(self.run_dir.checkpoints / f"step-{self.state.global_step}")

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
            self.report.clear_progress()
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
            saved = (
                str(self.run_dir.checkpoints / f"step-{self.last_saved_step}")
                if self.last_saved_step is not None
                else None
            )
            self.report.say(stopped_line(self.stop.reason, self.state.global_step, self.plan.total_steps, saved))
            self.callbacks.on_train_end(None, stopped_by=self.stop.reason)
            return result
        digests = self.model.replica_digests()
        if digests:
            same = len(set(digests)) == 1
            self.report.say(replicas_line(digests))
            result["replicas_identical"] = same
        confidence = self.calibrate()  # rank 0; the others wait in the summary's broadcast
        if confidence is not None:
            result["calibration"] = confidence.to_json()
        self.callbacks.on_log(
            "summary",
            {
                "total_time_s": total_time,
                "best_accuracy": self.state.best_accuracy,
                **({"replicas_identical": result["replicas_identical"]} if digests else {}),
                **({"calibration": result["calibration"]} if confidence is not None else {}),
            },
        )
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

    def calibrate(self) -> ConfidenceReport | None:
        """best/'s temperature (``calibration``) and the evaluation split's calibration error and coverage-accuracy
        (train/calibration.py): rank 0, from best/ as the server loads it; None on the other ranks or without best/."""
        if not (self.env.is_main and self.run_dir.best.is_dir() and self.config.run.calibration != "none"):
            return None
        if self.multi_label:
            self.report.say(
                "Calibration: skipped (multi-label: temperature scaling is fitted to a softmax; each label's sigmoid "
                "is used as trained, with its threshold tuned on the evaluation rows)"
            )
            return None
        c = self.config
        try:
            return calibrate_best(
                self.run_dir.best,
                self.data.eval_rows,
                self.data.calibration_rows,
                c.run.calibration,
                device=self.env.device,
                batch_size=c.batches.per_device_eval_batch_size,
            )
        except Exception as exc:  # the model is saved: served with the softmax as trained, and said so
            self.report.say(
                f"Calibration: not done ({type(exc).__name__}: {exc}); best/ keeps the temperature it had (1: none)"
            )
            return None

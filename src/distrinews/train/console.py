"""What a run tells its user: the banner, the progress bar, each epoch's lines, the end.

The lines are built by pure functions (tested without a run); ``Report`` prints them on rank 0
only and owns the progress bar. The machine-readable record of the same figures is
``train/metrics.py``'s ``log.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import TrainConfig
from ..distributed.process_group import DistEnv
from ..scores import confusion_table, per_class_table
from .metrics import Counts

RULE = "=" * 60


@dataclass(frozen=True)
class RunFacts:
    """What the banner states about the run, gathered by the trainer once it is built."""

    strategy: str
    title: str  # DDP, FSDP, or empty with one process
    communication: str
    precision: str
    total_steps: int
    parameters: int
    trainable: int
    train_rows: int
    rows_per_rank: int
    test_rows: int
    mfu_peak: str
    label_names: list[str]
    train_counts: list[int]  # rows of each label, in label order
    eval_counts: list[int]
    eval_from: str  # where the evaluation rows come from
    class_weights: list[float] | None = None  # the loss's, when class_weights is balanced
    calibration_rows: int = 0  # held out of training to fit the temperature on (calibration: temperature)


def banner_lines(config: TrainConfig, env: DistEnv, facts: RunFacts, resumed_from: str | None, step: int) -> list[str]:
    batches, o, m = config.batches, config.optimizer, config.model
    per_step = batches.per_device_train_batch_size * batches.gradient_accumulation_steps * env.world_size
    threads = f" x{torch.get_num_threads()} threads" if env.device.type == "cpu" else ""
    smoothing = o.label_smoothing_factor
    frozen = f"{m.freeze_layers} encoder layer{'s' if m.freeze_layers > 1 else ''}"
    share = config.data.calibration_split_percentage
    held_out = f"{facts.calibration_rows:,} held out of training ({share}%, stratified, to fit the temperature)"
    lines = [
        RULE,
        f"{facts.title} TRAINING CONFIGURATION".lstrip(),
        RULE,
        f"World size:           {env.world_size} ({env.backend or 'no process group'}, strategy {facts.strategy})",
        f"Batch size per device: {batches.per_device_train_batch_size}",
        f"Gradient accumulation: {batches.gradient_accumulation_steps}",
        f"Effective batch size: {per_step}",
        f"Learning rate:        {o.learning_rate:g}{schedule_words(config)}",
        f"Epochs:               {batches.num_train_epochs:g} ({facts.total_steps} optimizer steps)",
        f"Device:               {env.device}{threads}",
        f"Precision:            {facts.precision}",
        f"Model:                {m.model_name_or_path} ({facts.parameters / 1e6:.1f}M parameters)",
        f"Trainable:            {facts.trainable:,} parameters ({100 * facts.trainable / facts.parameters:.2f}%)"
        + (" with LoRA" if m.use_peft else ""),
        *_when(m.freeze_layers, f"Frozen:               the embeddings and the bottom {frozen} (forward only)"),
        f"Communication a step: {facts.communication}",
        f"Train samples:        {facts.train_rows:,} (each process sees {facts.rows_per_rank:,})",
        f"Test samples:         {facts.test_rows:,} from {facts.eval_from}",
        *_when(facts.calibration_rows, f"Calibration rows:     {held_out}"),
        *class_lines(facts),
        *_when(smoothing, f"Loss:                 cross-entropy, label smoothing {smoothing:g}"),
        *_when(o.ema_decay, f"Evaluated weights:    their moving average (ema_decay {o.ema_decay:g})"),
        f"MFU peak:             {facts.mfu_peak}",
        *_when(resumed_from is not None, f"Resumed from:         {resumed_from} (step {step})"),
    ]
    return [*lines, RULE]


def _when(asked: object, line: str) -> list[str]:
    """``line`` where the run asks for what it says (an optional line of the banner)."""
    return [line] if asked else []


def schedule_words(config: TrainConfig) -> str:
    """How the rate moves, where it is not the default linear decay with one rate for all layers."""
    words: list[str] = [] if config.optimizer.lr_scheduler_type == "linear" else [config.optimizer.lr_scheduler_type]
    if config.optimizer.layerwise_lr_decay != 1.0:
        words.append(f"layer-wise decay {config.optimizer.layerwise_lr_decay:g}")
    return f" ({', '.join(words)})" if words else ""


def class_lines(facts: RunFacts, width: int = 100) -> list[str]:
    """The labels with their rows in each split (train / test), wrapped to ``width``; the loss weights if any."""
    cells = [
        f"{name} {train:,}/{test:,}"
        for name, train, test in zip(facts.label_names, facts.train_counts, facts.eval_counts)
    ]
    head = f"Classes ({len(cells)}, train/test rows): "
    lines, line = [], head
    for i, cell in enumerate(cells):
        piece = cell + (" · " if i < len(cells) - 1 else "")
        if len(line) + len(piece) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece
    lines.append(line.rstrip())
    if facts.class_weights is not None:
        weights = ", ".join(f"{name} {w:.3g}" for name, w in zip(facts.label_names, facts.class_weights))
        lines.append(f"Class weights:        {weights} (balanced)")
    return lines


def epoch_lines(
    epoch: int, num_epochs: int, seconds: float, totals: Counts, metrics: dict[str, Any], summary: dict[str, Any]
) -> list[str]:
    """The seed's epoch lines, plus throughput, MFU and memory."""
    return [
        f"\nEpoch [{epoch + 1}/{num_epochs}] - {fmt_time(seconds)}",
        f"  Train Loss: {totals.loss:.4f} | Train Acc: {100 * totals.accuracy:.2f}%",
        f"  Test Loss:  {metrics['loss']:.4f} | Test Acc:  {100 * metrics['accuracy']:.2f}% "
        f"| Macro-F1: {100 * metrics['macro_f1']:.2f}%" + multilabel_words(metrics),
        f"  Throughput: {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s, "
        f"MFU {100 * summary['mfu']:.1f}%, peak memory {summary['peak_memory_mib']:.0f} MiB a process",
    ]


def multilabel_words(metrics: dict[str, Any]) -> str:
    """A multi-label evaluation's micro-F1 (its accuracy is the exact match), after the macro-F1."""
    if "micro_f1" not in metrics:
        return ""
    return f" | Micro-F1: {100 * metrics['micro_f1']:.2f}% (thresholds per label; accuracy = exact match)"


def replicas_line(digests: list[str]) -> str:
    same = "identical" if len(set(digests)) == 1 else "DIFFERENT"
    return f"Replicas: {same} parameters on the {len(digests)} ranks ({', '.join(digests)})"


def stopped_line(reason: str | None, step: int, total_steps: int, saved: str | None) -> str:
    """The last line of a run stopped early (SIGTERM, a preemption), naming what to resume from."""
    where = (
        f"checkpoint {saved}; continue with --resume auto" if saved else "no step trained in this run, nothing saved"
    )
    return f"\nStopped by {reason} at step {step} of {total_steps}: {where}."


def final_lines(
    total_seconds: float, best_accuracy: float | None, best_dir: Any, best_metrics: dict[str, Any] | None = None
) -> list[str]:
    """The end: time, best accuracy, and the best model's per-class scores and confusion matrix."""
    lines = [RULE, "TRAINING COMPLETE", RULE, f"Total time: {fmt_time(total_seconds)}"]
    if best_accuracy is not None:
        lines.append(f"Best test accuracy: {100 * best_accuracy:.2f}%")
    if best_metrics and "micro_f1" in best_metrics:
        lines.append(
            f"Best model: micro-F1 {100 * best_metrics['micro_f1']:.2f}%, "
            f"macro-F1 {100 * best_metrics['macro_f1']:.2f}% "
            f"at the thresholds tuned on the evaluation rows (at 0.5: {100 * best_metrics['micro_f1_at_0.5']:.2f}%, "
            f"{100 * best_metrics['macro_f1_at_0.5']:.2f}%), stored in best/distrinews.json"
        )
    if best_metrics and best_metrics.get("per_class"):
        lines += ["Per class (the best model, on the test rows):", *per_class_table(best_metrics)]
        confusion = confusion_table(best_metrics)  # none for multi-label
        if confusion:
            lines += ["Confusion matrix (rows: true label, columns: predicted, numbered as the rows):", *confusion]
    return [*lines, f"Checkpoint saved to: {best_dir}"]


def fmt_time(seconds: float, digits: int = 1) -> str:
    """``1h 2m 5s``; with ``digits`` 2, minutes and seconds padded to two (``1h 02m 05s``, a table's column)."""
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:0{digits}d}m {s:0{digits}d}s" if h else f"{m}m {s:0{digits}d}s"


def progress_bar(total: int, desc: str, unit: str, show: bool, **more: Any) -> Any:
    """A bar as each of a run's draws it: redrawn at most once a second, as wide as the terminal."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not show, dynamic_ncols=True, mininterval=1.0, **more)


class Report:
    """Rank 0's voice: ``say`` prints there and nowhere else; the progress bar likewise."""

    def __init__(self, env: DistEnv, disable_tqdm: bool):
        self.enabled = env.is_main
        self.disable_tqdm = disable_tqdm
        self.progress: Any = None  # the training's bar (tqdm), once open_progress made it
        if not env.is_main:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # one copy of the library's warnings, from rank 0

    def say(self, *lines: str) -> None:
        if self.enabled:
            for line in lines:
                print(line)

    def open_progress(self, total: int, initial: int) -> None:
        self.progress = progress_bar(total, "train", "step", self.enabled and not self.disable_tqdm, initial=initial)

    def close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()

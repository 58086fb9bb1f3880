"""Classification metrics from a confusion matrix, and the run's metric sinks (JSONL, TensorBoard).

Ranks add up counts (confusion matrix, loss sum), never averages of averages, so metrics are
exact for any world size.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from .model import LABELS


def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int = len(LABELS)) -> torch.Tensor:
    """Counts[true, predicted] as int64."""
    idx = labels.to(torch.int64) * num_classes + preds.to(torch.int64)
    return torch.bincount(idx, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def classification_metrics(confusion: torch.Tensor, loss_sum: float, label_names=LABELS) -> dict[str, Any]:
    cm = confusion.to(torch.float64).cpu()
    total = cm.sum().item()
    correct = cm.diag().sum().item()
    support = cm.sum(dim=1)
    predicted = cm.sum(dim=0)
    tp = cm.diag()
    recall = torch.where(support > 0, tp / support.clamp(min=1), torch.zeros_like(tp))
    precision = torch.where(predicted > 0, tp / predicted.clamp(min=1), torch.zeros_like(tp))
    f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall).clamp(min=1e-12), torch.zeros_like(tp))
    return {
        "samples": int(total),
        "loss": loss_sum / total if total else float("nan"),
        "accuracy": correct / total if total else float("nan"),
        "macro_f1": f1.mean().item(),
        "per_class_accuracy": {name: recall[i].item() for i, name in enumerate(label_names)},
    }


class MetricsLogger:
    """Rank 0's sinks: ``log.jsonl`` (one object per line, flushed) and TensorBoard scalars.

    Other ranks get a logger with ``enabled=False`` that does nothing, so call sites need no rank checks.
    """

    def __init__(self, run_dir: str | os.PathLike, enabled: bool, tensorboard: bool = True):
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(run_dir / "log.jsonl", "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tb"))

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in _flatten(values).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out

"""Multi-label evaluation: a threshold per label tuned on the evaluation split, micro- and macro-F1, per-label scores.

Each label is a yes/no question answered by its own sigmoid. Its threshold is the one of ``THRESHOLDS``
(0.01 ... 0.99) at which its F1 on the evaluation split is highest (of equal F1s, the one nearest 0.5; a label
with no positive row keeps 0.5). The ranks add up counts, never averages: per label, the positive and negative
rows in each interval between two candidate thresholds (``ScoreHistogram``), from which every threshold's true and
false positives follow exactly, so the thresholds are the same on every rank. The rows whose every label is then
right (exact match, reported as ``accuracy``) are summed too. ``best/`` stores its thresholds (``distrinews.json``),
and every runtime applies them.

The scores at 0.5 are reported beside the tuned ones: the tuned thresholds have seen the split they are scored on,
so their F1 is optimistic; give a ``validation_file`` to keep a test split out of the tuning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from ..checkpoint.records import DEFAULT_THRESHOLD
from ..config import MULTI_LABEL
from ..scores import f1_from_counts

HISTOGRAM_BINS = 100  # candidate thresholds 0.01 ... 0.99: the edges between the bins
THRESHOLDS = torch.arange(1, HISTOGRAM_BINS, dtype=torch.float64) / HISTOGRAM_BINS


class ScoreHistogram:
    """Counts[positive?, label, bin] of sigmoid scores: bin j holds the scores from ``THRESHOLDS[j - 1]`` (bin 0:
    from 0) up to, not including, ``THRESHOLDS[j]``. A score is at or above threshold ``j`` iff its bin is > j."""

    def __init__(self, num_labels: int, device: torch.device | str = "cpu"):
        self.counts = torch.zeros(2, num_labels, HISTOGRAM_BINS, dtype=torch.int64, device=device)
        self._edges = THRESHOLDS.to(device=device, dtype=torch.float32)

    def add(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        """``scores`` [rows, labels] sigmoid probabilities (float32, as the runtimes compare them), ``labels`` 0/1."""
        bins = torch.bucketize(scores.float().contiguous(), self._edges, right=True)  # edges <= score
        positive = (labels > 0.5).long()
        label = torch.arange(scores.shape[1], device=scores.device).expand_as(bins)
        flat = (positive * scores.shape[1] + label) * HISTOGRAM_BINS + bins
        self.counts += torch.bincount(flat.reshape(-1), minlength=self.counts.numel()).reshape(self.counts.shape)

    def at_thresholds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(true positives, false positives, positives): the first two [labels, thresholds], the last [labels]."""
        above = self.counts.flip(-1).cumsum(-1).flip(-1)[..., 1:]  # at or above threshold j: bins j+1 and up
        return above[1], above[0], self.counts[1].sum(-1)


def f1(tp: torch.Tensor, fp: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``scores.f1_from_counts`` of counts (float64, elementwise): FN = positives - TP."""
    return cast(torch.Tensor, f1_from_counts(tp.double(), fp.double(), positives.double() - tp.double()))


def tune_thresholds(histogram: ScoreHistogram) -> list[float]:
    """Each label's threshold of highest F1 (see the module docstring)."""
    tp, fp, positives = histogram.at_thresholds()
    scores = f1(tp, fp, positives[:, None].expand_as(tp)).cpu()
    distance = (THRESHOLDS - DEFAULT_THRESHOLD).abs()

    def best(label: int) -> float:
        ties = torch.nonzero(scores[label] == scores[label].max()).flatten()
        return round(float(THRESHOLDS[int(ties[distance[ties].argmin()])]), 6)

    return [best(label) if int(positives[label]) else DEFAULT_THRESHOLD for label in range(scores.shape[0])]


def scores_at(histogram: ScoreHistogram, thresholds: Sequence[float], label_names: Sequence[str]) -> dict[str, Any]:
    """Micro- and macro-F1 and per-label precision, recall, F1 and support, each label at its threshold. Macro-F1
    averages the labels with positive rows (as ``scores.classification_scores`` does for classes)."""
    tp_all, fp_all, positives = histogram.at_thresholds()
    index = torch.tensor([round(t * HISTOGRAM_BINS) - 1 for t in thresholds], device=tp_all.device)  # in THRESHOLDS
    tp, fp = (counts.gather(1, index[:, None]).squeeze(1).cpu() for counts in (tp_all, fp_all))
    positives = positives.cpu()
    per_class: dict[str, dict[str, float | int]] = {}
    for i, name in enumerate(label_names):
        t, f, p = int(tp[i]), int(fp[i]), int(positives[i])
        per_class[name] = {
            "precision": t / (t + f) if t + f else 0.0,
            "recall": t / p if p else 0.0,
            "f1": float(f1(tp[i], fp[i], positives[i])),
            "support": p,
            "threshold": float(thresholds[i]),
        }
    present = [name for name, s in per_class.items() if s["support"]]
    return {
        "micro_f1": float(f1(tp.sum(), fp.sum(), positives.sum())),
        "macro_f1": sum(per_class[n]["f1"] for n in present) / len(present) if present else float("nan"),
        "classes_present": present,
        "per_class": per_class,
        "support": {name: per_class[name]["support"] for name in label_names},
    }


def multilabel_metrics(
    histogram: ScoreHistogram,
    thresholds: Sequence[float],
    exact_matches: int,
    rows: int,
    loss_sum: float,
    label_names: Sequence[str],
) -> dict[str, Any]:
    """The evaluation's record: ``accuracy`` is the exact match (every label of a row right), ``loss`` the binary
    cross-entropy per (row, label); the F1s at the tuned thresholds, and at 0.5 for comparison."""
    tuned = scores_at(histogram, thresholds, label_names)
    untuned = scores_at(histogram, [DEFAULT_THRESHOLD] * len(label_names), label_names)
    return {
        "samples": rows,
        "loss": loss_sum / rows if rows else float("nan"),
        "accuracy": exact_matches / rows if rows else float("nan"),
        "problem_type": MULTI_LABEL,
        "micro_f1": tuned["micro_f1"],
        "macro_f1": tuned["macro_f1"],
        "micro_f1_at_0.5": untuned["micro_f1"],
        "macro_f1_at_0.5": untuned["macro_f1"],
        "thresholds": dict(zip(label_names, (float(t) for t in thresholds))),
        **{key: tuned[key] for key in ("classes_present", "per_class", "support")},
    }


def exact_matches(scores: torch.Tensor, labels: torch.Tensor, thresholds: Sequence[float]) -> int:
    """Rows whose every label is right: score at or above its threshold exactly where the label is 1."""
    if scores.numel() == 0:
        return 0
    limits = torch.tensor(list(thresholds), dtype=torch.float32, device=scores.device)
    return int(((scores.float() >= limits) == (labels > 0.5)).all(-1).sum())


class FixedThresholdTally:
    """A multi-label model's scores at its own thresholds, added a batch at a time (``distrinews eval --input``, whose
    runtime may be ONNX), counted as ``evaluate`` counts them; no loss (the runtimes give scores, not logits)."""

    def __init__(self, label_names: Sequence[str], thresholds: Sequence[float]):
        self.label_names, self.thresholds = list(label_names), list(thresholds)
        self.histogram = ScoreHistogram(len(self.label_names))
        self.matched = self.rows = 0

    def add(self, scores: Any, labels: Any) -> None:
        """``scores`` [rows, labels] sigmoid probabilities, ``labels`` 0/1 (arrays or nested lists)."""
        scores, labels = torch.as_tensor(scores, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.float32)
        self.histogram.add(scores, labels)
        self.matched += exact_matches(scores, labels, self.thresholds)
        self.rows += scores.shape[0]

    def to_json(self) -> dict[str, Any]:
        metrics = multilabel_metrics(
            self.histogram, self.thresholds, self.matched, self.rows, float("nan"), self.label_names
        )
        del metrics["loss"]
        return metrics

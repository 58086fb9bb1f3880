"""Exact evaluation: every test row scored by exactly one rank, counts summed across ranks.

Nothing here draws from the random number generators, so an evaluation in the middle of
training leaves the training's dropout masks (and hence a resumed run) untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import tracing
from ..data.collate import Collator
from ..data.sampler import eval_shard
from ..data.tokenized import TokenizedDataset
from ..distributed.process_group import DistEnv, all_reduce_max, all_reduce_sum
from ..model import forward_loss, model_label_names
from .console import progress_bar
from .metrics import classification_metrics, confusion_matrix
from .multilabel import ScoreHistogram, exact_matches, multilabel_metrics, tune_thresholds
from .precision import Precision


@tracing.traced(
    "distrinews.train.evaluate",
    lambda model, dataset, env, *args, **kwargs: {
        "distrinews.rows": len(dataset),
        "distrinews.rank": env.rank,
        "distrinews.world_size": env.world_size,
    },
    lambda metrics: {"distrinews.accuracy": metrics["accuracy"], "distrinews.loss": metrics["loss"]},
)
@torch.inference_mode()
def evaluate(
    model: torch.nn.Module,
    dataset: TokenizedDataset,
    env: DistEnv,
    batch_size: int,
    precision: Precision,
    progress: bool = False,
    label_names: Sequence[str] | None = None,
    lockstep: bool = False,
    thresholds: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Loss, accuracy, macro-F1 and per-class scores over the whole dataset, for any world size (multi-label:
    ``multilabel.py``, with ``thresholds`` given or tuned on the dataset).

    ``model`` must be the unwrapped module: ranks score shards that differ by up to a row, so their numbers of
    batches can differ. ``lockstep``: a sharded model's every forward pass gathers from all ranks, so every rank runs
    as many as the busiest one, the extra ones on a placeholder row that is not counted.
    """
    was_training = model.training
    model.eval()
    num_labels = len(model_label_names(model))
    shard = eval_shard(dataset.lengths, env.rank, env.world_size)
    batches = -(-len(shard) // batch_size)
    if lockstep and env.distributed:
        batches = int(all_reduce_max(torch.tensor([batches], device=env.device), env).item())
    tally = _Tally(num_labels, dataset.multi_label, env.device)
    # Rank 0's bar counts rank 0's share; the ranks' shares differ by at most one row.
    bar = progress_bar(len(shard), "eval", "row", progress, leave=False)
    collate = Collator(dataset.pad_token_id)
    for b in range(batches):
        rows = shard[b * batch_size : (b + 1) * batch_size]
        batch = {k: v.to(env.device, non_blocking=True) for k, v in collate([dataset[i] for i in rows or [0]]).items()}
        loss, logits = forward_loss(model, batch, precision.autocast, reduction="sum")
        if not rows:
            continue  # a lockstep placeholder
        tally.add(loss, logits, batch["labels"])
        bar.update(len(rows))
    bar.close()
    all_reduce_sum(tally.loss_sum, env)
    model.train(was_training)
    names = label_names or model_label_names(model)
    if tally.histogram is None:
        all_reduce_sum(tally.confusion, env)
        return classification_metrics(tally.confusion, tally.loss_sum.item(), names)
    return _multilabel_result(tally, thresholds, len(shard), names, env)


class _Tally:
    """What this rank's batches add up to: the summed loss, and the confusion matrix or (multi-label) the score
    histogram, with the scores kept for the exact matches."""

    def __init__(self, num_labels: int, multi_label: bool, device: torch.device) -> None:
        self.num_labels = num_labels
        self.confusion = torch.zeros(num_labels, num_labels, dtype=torch.int64, device=device)
        self.histogram = ScoreHistogram(num_labels, device) if multi_label else None
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.loss_sum += loss.double()
        if self.histogram is not None:
            scores = torch.sigmoid(logits.float())
            self.histogram.add(scores, labels)
            self.kept.append((scores, labels))
        else:
            self.confusion += confusion_matrix(logits.argmax(-1), labels, self.num_labels)


def _multilabel_result(
    tally: _Tally, thresholds: Sequence[float] | None, rows: int, names: Sequence[str], env: DistEnv
) -> dict[str, Any]:
    """The multi-label metrics over every rank: thresholds (given, or tuned on the summed histogram), exact matches."""
    histogram = tally.histogram
    assert histogram is not None, "a multi-label tally"
    all_reduce_sum(histogram.counts, env)
    if thresholds is None:
        thresholds = tune_thresholds(histogram)  # the same on every rank: a function of the summed counts
    matched = sum(exact_matches(scores, labels, thresholds) for scores, labels in tally.kept)
    totals = torch.tensor([matched, rows], dtype=torch.int64, device=env.device)
    all_reduce_sum(totals, env)
    return multilabel_metrics(histogram, thresholds, int(totals[0]), int(totals[1]), tally.loss_sum.item(), names)

"""Log-probabilities of one checkpoint or an ensemble of checkpoints over a list of texts (the PyTorch predictor).

What a distillation teacher gives its student (``train.distillation``), and how an ensemble is scored:
each member reads the texts with its own tokenizer and ``max_length``, in length-sorted batches (``logits``), and
the ensemble's distribution is the mean of the members' probabilities, kept as its logarithm.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .predictor import Predictor


@dataclass
class EnsembleOutput:
    members: np.ndarray  # [K, N, C] float32: each member's log-softmax at temperature 1
    log_probs: np.ndarray  # [N, C] float32: log of the members' mean probability
    labels: list[str]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    log_probabilities: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return log_probabilities


def ensemble_log_probs(
    checkpoints: Sequence[str | os.PathLike[str]],
    texts: Sequence[str],
    labels: Sequence[str] | None = None,
    device: Any = None,
    batch_size: int = 256,
    say: Callable[[str], None] = lambda line: None,
) -> EnsembleOutput:
    """Each checkpoint's log-probabilities of ``texts`` (fp32 PyTorch on ``device``), and their ensemble's; every
    member must name the same labels in the same order (``labels``, if given): a column is a class."""
    import time

    import torch

    members, names = [], list(labels) if labels is not None else None
    for checkpoint in checkpoints:
        started = time.perf_counter()
        predictor = Predictor(checkpoint, device=device, max_batch_size=batch_size)
        names = list(predictor.labels) if names is None else names
        if list(predictor.labels) != names:
            raise ConfigError(
                f"config field 'teacher_model_name_or_path': {checkpoint} predicts the labels "
                f"{', '.join(predictor.labels)}, but {', '.join(names)} were expected (in this order)"
            )
        members.append(log_softmax(predictor.logits(texts)))  # length-sorted batches of batch_size
        del predictor
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        say(f"teacher {checkpoint}: {len(texts):,} rows in {time.perf_counter() - started:.1f} s")
    stacked = np.stack(members)
    # log(mean_k p_k) = logsumexp_k(log p_k) - log K: finite wherever every member's log-probability is
    top = stacked.max(axis=0)
    mean = top + np.log(np.exp(stacked - top).sum(axis=0)) - np.log(len(members))
    return EnsembleOutput(stacked.astype(np.float32), mean.astype(np.float32), names or [])

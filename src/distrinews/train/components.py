"""Pieces of the training loop that read no config: the training clock, the balanced class weights, the
learning-rate schedules, the grouping of micro-batches into optimizer steps, and the peak memory.
What is built from the config is in ``build.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import resource
import time
from collections.abc import Iterable, Iterator

import torch

from ..data.tokenized import TokenizedDataset
from ..distributed.process_group import DistEnv, all_reduce_max


class TrainClock:
    """Seconds spent training: evaluation and saving are paused out, so logged rates count training only."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._paused = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self._started - self._paused

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - started


def class_weights(dataset: TokenizedDataset, num_labels: int, device: torch.device) -> torch.Tensor:
    """scikit-learn's "balanced" weights, ``rows / (classes x rows of the class)``; 0 for a class without rows."""
    counts = torch.bincount(dataset.labels, minlength=num_labels).double()
    present = int((counts > 0).sum())
    weights = torch.where(counts > 0, counts.sum() / (present * counts.clamp(min=1)), torch.zeros_like(counts))
    return weights.float().to(device)


def schedule_with_warmup(
    optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Hugging Face's schedules (``lr_scheduler_type`` linear, cosine, constant_with_warmup), the same multipliers
    step for step as ``transformers.get_scheduler``; each parameter group's own rate is multiplied.

    Written out because importing them from transformers pulls in its Trainer's utilities (and
    peft where installed): seconds of start-up in every worker, for a few lines of arithmetic.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        if kind == "constant_with_warmup":
            return 1.0
        if kind == "cosine":
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_windows(
    batches: Iterable[dict[str, torch.Tensor]], accumulation: int
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Group micro-batches into optimizer steps; an epoch's last window may be shorter."""
    each = iter(batches)
    while window := list(itertools.islice(each, accumulation)):
        yield window


def peak_memory_mib(env: DistEnv) -> float:
    """The largest peak memory of any rank (a collective): resident set on CPU, allocated on CUDA."""
    if env.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(env.device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return float(all_reduce_max(torch.tensor([peak], dtype=torch.float64, device=env.device), env).item())

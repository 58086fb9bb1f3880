"""The pieces the ``Trainer`` is built from: the step plan, the data, the model,
the optimizer and its schedule. Each takes its own section of the config (``config/sections.py``).
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..config import BatchConfig, DataConfig, ModelConfig, OptimizerConfig
from ..data.labelled import LabelledData, load_labelled
from ..data.rows import RawSplit
from ..data.splits import hold_out, stratified_sample
from ..data.tokenized import TokenizedDataset, tokenize_cached
from ..distributed.process_group import DistEnv, all_reduce_max, main_process_first
from ..model import (
    add_lora,
    build_model,
    build_tokenizer,
    freeze_layers,
    freeze_word_embeddings,
    layer_depth,
    num_layers,
)
from .dropout import use_fast_dropout


@dataclass(frozen=True)
class StepPlan:
    """How the rows divide into micro-batches and optimizer steps."""

    micro_batch: int  # rows per forward pass on one rank
    accumulation: int  # micro-batches per optimizer step
    micro_per_epoch: int
    steps_per_epoch: int
    total_steps: int

    @classmethod
    def of(cls, config: BatchConfig, rows_per_rank: int) -> StepPlan:
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


def build_train_model(
    config: ModelConfig, seed: int, device: torch.device, labels: list[str], problem_type: str | None = None
) -> torch.nn.Module:
    """The classifier as it trains, one output per label: dropout overrides, frozen embeddings and bottom layers,
    fast dropout on CPU, LoRA; on ``device``. ``seed`` draws the new head's weights; ``problem_type`` is the data's
    (``DataConfig.problem_type``, which the model's config carries)."""
    model = build_model(
        config.model_name_or_path,
        labels=labels,
        problem_type=problem_type,
        dropout=config.dropout,
        seed=seed,
        attention_dropout=config.attention_dropout,
    )
    if config.freeze_word_embeddings:
        freeze_word_embeddings(model)
    if config.freeze_layers:
        freeze_layers(model, config.freeze_layers)
    if config.fast_dropout and device.type == "cpu":
        use_fast_dropout(model)
    if config.use_peft:
        model = add_lora(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
    return model.to(device)


@dataclass
class Datasets:
    train: TokenizedDataset | None
    test: TokenizedDataset  # the evaluation split (AG News's test split, or the user's validation rows)
    tokenizer: Any
    label_names: list[str]
    labelled: LabelledData  # the rows as read (sampled), their source and the warnings about them
    eval_rows: RawSplit  # the evaluation rows as text (the int8 model's check reads them)
    calibration_rows: RawSplit | None = None  # held out of training to fit the temperature on (train/calibration.py)

    @property
    def train_set(self) -> TokenizedDataset:
        """The tokenized training split, for the callers that train (``prepare_data``'s ``need_train``)."""
        assert self.train is not None, "prepare_data(need_train=False) read no training split"
        return self.train

    @property
    def train_rows(self) -> RawSplit:
        """The training rows as text (sampled), for the callers that train."""
        assert self.labelled.train is not None, "prepare_data(need_train=False) read no training split"
        return self.labelled.train


def prepare_data(
    config: DataConfig,
    tokenizer_name: str,
    seed: int,
    env: DistEnv,
    need_train: bool = True,
    calibration_percentage: int = 0,
) -> Datasets:
    """Read, check, sample (``seed``) and tokenize with the model's tokenizer; each node's first process builds the
    token cache, the others read it. ``calibration_percentage`` > 0: that share of the training rows (after
    ``train_samples``) is held out of training, stratified and seeded, as ``calibration_rows``."""
    tokenizer = build_tokenizer(tokenizer_name)
    splits: dict[str, TokenizedDataset] = {}
    calibration = None
    with main_process_first(env, local=True):
        labelled = load_labelled(config, seed, need_train=need_train)
        if labelled.train is not None:
            every = labelled.train
            picked = stratified_sample(every.strata, config.train_samples, seed)
            labelled.train = every.subset(picked)
            if calibration_percentage:
                labelled.train, calibration = calibration_split(every, picked, calibration_percentage, seed)
        labelled.eval = labelled.eval.subset(stratified_sample(labelled.eval.strata, config.eval_samples, seed))
        for name, raw in (("train", labelled.train), ("test", labelled.eval)):
            if raw is not None:
                splits[name] = tokenize_cached(
                    raw, tokenizer, config.max_length, config.cache_dir, build=env.is_local_main
                )
    return Datasets(
        splits.get("train"), splits["test"], tokenizer, labelled.label_names, labelled, labelled.eval, calibration
    )


def calibration_split(every: RawSplit, picked: list[int], percentage: int, seed: int) -> tuple[RawSplit, RawSplit]:
    """(training rows, calibration rows). Where ``train_samples`` left enough rows unsampled, the calibration
    rows (``percentage`` of the sample's size, stratified) come from those, so the run trains on the same rows
    as without calibration; otherwise that share of the sample is held out of training."""
    chosen = set(picked)
    rest = [i for i in range(len(every)) if i not in chosen]
    want = round(len(picked) * percentage / 100)
    if want and len(rest) >= 2 * want:
        held = stratified_sample([every.labels[i] for i in rest], want, seed)
        return every.subset(picked), every.subset(sorted(rest[j] for j in held))
    sample = every.subset(picked)
    kept, held_out = hold_out(sample.labels, percentage, seed)
    return sample.subset(kept), sample.subset(held_out)


def class_weights(dataset: TokenizedDataset, num_labels: int, device: torch.device) -> torch.Tensor:
    """scikit-learn's "balanced" weights, ``rows / (classes x rows of the class)``; 0 for a class without rows."""
    counts = torch.bincount(dataset.labels, minlength=num_labels).double()
    present = int((counts > 0).sum())
    weights = torch.where(counts > 0, counts.sum() / (present * counts.clamp(min=1)), torch.zeros_like(counts))
    return weights.float().to(device)


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm weights; one fused kernel for the whole update.

    With ``layerwise_lr_decay`` d < 1, a parameter ``k`` layers below the head learns at ``learning_rate x d**k``
    (ELECTRA's layer-wise decay): the pretrained lower layers move less than the new head."""
    layers = num_layers(model)
    groups: dict[tuple[int, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            depth = layer_depth(name, layers) if config.layerwise_lr_decay != 1.0 else 0
            decays = not (p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name)
            groups.setdefault((depth, decays), []).append(p)
    if config.layerwise_lr_decay == 1.0:  # always the two groups [decay, no decay] (what checkpoints hold)
        groups.setdefault((0, True), []), groups.setdefault((0, False), [])
    ordered = sorted(groups, key=lambda key: (key[0], not key[1]))
    param_groups = [
        {
            "params": groups[depth, decays],
            "weight_decay": config.weight_decay if decays else 0.0,
            "lr": config.learning_rate * config.layerwise_lr_decay**depth,
        }
        for depth, decays in ordered
    ]
    return torch.optim.AdamW(param_groups, lr=config.learning_rate, fused=device.type in ("cpu", "cuda"))


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


def linear_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Hugging Face's ``get_linear_schedule_with_warmup``."""
    return schedule_with_warmup(optimizer, "linear", warmup_steps, total_steps)


def optimizer_windows(
    batches: Iterable[dict[str, torch.Tensor]], accumulation: int
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Group micro-batches into optimizer steps; an epoch's last window may be shorter."""
    window: list[dict[str, torch.Tensor]] = []
    for batch in batches:
        window.append(batch)
        if len(window) == accumulation:
            yield window
            window = []
    if window:
        yield window


def peak_memory_mib(env: DistEnv) -> float:
    """The largest peak memory of any rank (a collective): resident set on CPU, allocated on CUDA."""
    if env.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(env.device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return float(all_reduce_max(torch.tensor([peak], dtype=torch.float64, device=env.device), env).item())

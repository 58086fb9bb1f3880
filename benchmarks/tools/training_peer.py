"""What the training peers of ``distrinews train`` share: Hugging Face Trainer (``hf_trainer``), PyTorch Lightning
(``lightning_trainer``) and a plain Accelerate loop (``accelerate_loop``).

Each runs under torchrun as ``python -m benchmarks.tools.NAME``, on the same rows (our loader, seeded stratified
sample, our token cache: identical token ids), the same model and head initialisation (``build_model``), dynamic
padding (``DataCollatorWithPadding``), length grouping (transformers' length-grouped samplers), fused AdamW with
Trainer's own weight-decay groups (biases and LayerNorm exempt), a linear warm-up and decay over the steps of one
epoch, gradient clipping and bf16 autocast where the machine computes bf16 in hardware. Each records the time at
the end of every optimizer step (``StepTimes``) and is then scored by the same exact evaluator as ours
(``score_and_report``), so that the runs differ only in the library that drives the loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler, RandomSampler, Sampler

from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.data.splits import load_split, stratified_sample
from distrinews.data.tokenized import TokenizedDataset, tokenize_cached
from distrinews.distributed.process_group import DistEnv
from distrinews.model import build_model, build_tokenizer
from distrinews.train.evaluation import evaluate
from distrinews.train.precision import Precision

from .common import comparison_parser

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import PreTrainedTokenizerBase

EVAL_BATCH = 128  # the evaluator's batch, as ours scores its runs


class Rows(Dataset[dict[str, Any]]):
    """Our tokenized rows as the dicts transformers' collators expect (no padding: the collator pads per batch)."""

    def __init__(self, tokenized: TokenizedDataset):
        self.ds = tokenized

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids, label, _ = self.ds[i]
        return {"input_ids": ids.tolist(), "labels": label}


@dataclass
class Setup:
    """One process's share of a peer run: the options, its place in the world, and what it trains."""

    args: argparse.Namespace
    rank: int
    local_rank: int
    world: int
    local_world: int
    tokenizer: PreTrainedTokenizerBase
    train: TokenizedDataset
    model: torch.nn.Module  # a transformers sequence classifier: its forward takes labels, returns .loss

    def env(self) -> DistEnv:
        return DistEnv(
            self.rank,
            self.local_rank,
            self.world,
            self.local_world,
            torch.device("cpu"),
            "gloo" if self.world > 1 else None,
        )


def parse_args(description: str) -> argparse.Namespace:
    """The shared options (``common.add_shared_arguments``), ``--result`` and ``--group-by-length``; ``--bf16``
    decided here when not given, as ``compare`` decides it."""
    p = comparison_parser(description)
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    if args.bf16 is None:
        from distrinews.distributed.machine import bf16_is_fast

        args.bf16 = bf16_is_fast("cpu")
    return args


def setup(args: argparse.Namespace) -> Setup:
    """The tokenizer, the training rows and the model, identical in every peer (and in ours)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    tokenizer = build_tokenizer(args.model)
    raw = load_split(args.data, "train")
    raw = raw.subset(stratified_sample(raw.labels, args.train_samples, args.seed))
    # Every rank reads the same cache file; it was written by an earlier run or is written atomically here.
    train = tokenize_cached(raw, tokenizer, args.max_length, None, build=True)
    return Setup(
        args,
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("LOCAL_RANK", 0)),
        world,
        int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        tokenizer,
        train,
        build_model(args.model, seed=args.seed, labels=AG_NEWS_LABELS),
    )


def collator(s: Setup) -> Any:
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(s.tokenizer)


def whole_sampler(s: Setup) -> Sampler[int]:
    """The order of every row, the same on every rank, for a library that deals the batches out to the ranks itself
    (Accelerate's ``prepare``, as under Trainer): length-grouped as Trainer's ``group_by_length``, else shuffled."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    generator = torch.Generator().manual_seed(s.args.seed)
    if s.args.group_by_length:
        return LengthGroupedSampler(s.args.batch_size, lengths=s.train.lengths.tolist(), generator=generator)
    return RandomSampler(Rows(s.train), generator=generator)


def rank_sampler(s: Setup) -> Sampler[int]:
    """This rank's share of the rows, for a library that takes a distributed sampler from the user (Lightning with
    ``use_distributed_sampler=False``: its own wrapper would shuffle the grouped order away)."""
    from transformers.trainer_pt_utils import DistributedLengthGroupedSampler

    if s.args.group_by_length:
        return DistributedLengthGroupedSampler(
            s.args.batch_size, num_replicas=s.world, rank=s.rank, seed=s.args.seed, lengths=s.train.lengths.tolist()
        )
    return DistributedSampler(Rows(s.train), num_replicas=s.world, rank=s.rank, shuffle=True, seed=s.args.seed)


def optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """Fused AdamW over Trainer's two groups: weight decay on the weights ``Trainer.get_decay_parameter_names``
    names (its rule, called unbound: it reads nothing of the Trainer), none on biases and LayerNorm."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(cast(Any, None), model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.learning_rate, fused=True)


def schedule(opt: torch.optim.Optimizer, args: argparse.Namespace, steps: int) -> LambdaLR:
    """Linear warm-up over ``ceil(warmup_ratio x steps)`` optimizer steps, then linear decay to 0 (Trainer's
    ``warmup_steps`` below 1 is that ratio)."""
    from transformers import get_linear_schedule_with_warmup

    return cast("LambdaLR", get_linear_schedule_with_warmup(opt, math.ceil(args.warmup_ratio * steps), steps))


class StepTimes:
    """When the loop began and when each optimizer step ended, in wall-clock seconds: what ``compare.run_script``
    reads back (``step_times``, ``train_start``, ``steps``)."""

    def __init__(self) -> None:
        self.train_start: float | None = None
        self.step_times: list[float] = []

    def start(self) -> None:
        self.train_start = time.time()

    def step(self) -> None:
        self.step_times.append(time.time())

    def record(self) -> dict[str, Any]:
        """The figures ``compare.run_script`` reads, and the loop's time from its start to its last step."""
        start, ends = self.train_start, self.step_times
        elapsed = ends[-1] - start if start is not None and ends else None
        return {
            "step_times": self.step_times,
            "train_start": self.train_start,
            "steps": len(self.step_times),
            "train_time_s": elapsed,
        }


def score_and_report(s: Setup, model: torch.nn.Module, times: StepTimes, **figures: Any) -> None:
    """Score ``model`` with our exact evaluator on the test split (every rank takes part), and on rank 0 write the
    result ``compare`` reads: the step times, the global batch, the test metrics and ``figures`` (``train_loss``,
    ``train_time_s``, the library's own)."""
    test_raw = load_split(s.args.data, "test")
    test_raw = test_raw.subset(stratified_sample(test_raw.labels, s.args.eval_samples, s.args.seed))
    test = tokenize_cached(test_raw, s.tokenizer, s.args.max_length, None, build=True)
    precision = Precision("cpu", torch.bfloat16 if s.args.bf16 else None)
    metrics = evaluate(model, test, s.env(), EVAL_BATCH, precision)
    if s.rank == 0:
        result = times.record() | {"global_batch": s.args.batch_size * s.world, "world_size": s.world}
        with open(s.args.result, "w") as fh:
            json.dump(result | figures | {"test": metrics}, fh)


def leave() -> None:
    """Rank 0 wrote the result; leave together (a rank left alone in teardown can hang)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

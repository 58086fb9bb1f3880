"""The reference system's training loop (seed 003_d2ea3caf0b11520d, training/train_ddp.py), for speed comparisons.

The seed is ``../shared/seeds/003_d2ea3caf0b11520d.txt``.

What makes it the reference loop: a Dataset that tokenizes each row when it is fetched and pads it to
max_length (128), fp32 throughout, ``DistributedSampler`` + ``DataLoader``, ``DDP(model)`` with its
defaults, ``AdamW(model.parameters())`` (one parameter group, torch's default implementation),
``get_linear_schedule_with_warmup``, and an ``AverageMeter`` fed ``loss.item()`` and the batch
accuracy every step. What it shares with ours so the comparison is fair: the same rows (our
loader and seeded stratified sample), the same model and head initialisation (``build_model``),
the same learning rate, warm-up, weight decay, clipping, batch size and number of steps; and the
same exact evaluator on the test split afterwards.

Run under torchrun (``python -m benchmarks.tools.compare`` does), from the repository root:
    torchrun --nproc-per-node 2 -m benchmarks.tools.reference_loop --train-samples 3200 --result out.json
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import get_linear_schedule_with_warmup

from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.data.splits import load_split, stratified_sample
from distrinews.data.tokenized import tokenize_cached
from distrinews.distributed.process_group import DistEnv
from distrinews.model import build_model, build_tokenizer
from distrinews.train.evaluation import evaluate
from distrinews.train.precision import Precision

from .common import comparison_parser

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class AGNewsDataset(Dataset[dict[str, torch.Tensor]]):
    """The reference dataset: tokenizes on every fetch, every row padded to max_length."""

    def __init__(self, texts: list[str], labels: list[int], tokenizer: PreTrainedTokenizerBase, max_length: int = 128):
        self.texts, self.labels, self.tokenizer, self.max_length = texts, labels, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            self.texts[idx], truncation=True, padding="max_length", max_length=self.max_length, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"].squeeze(0),
            "attention_mask": enc["attention_mask"].squeeze(0),
            "labels": torch.tensor(self.labels[idx], dtype=torch.long),
        }


class AverageMeter:
    def __init__(self) -> None:
        self.sum, self.count = 0.0, 0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.sum / max(1, self.count)


def main() -> None:
    p = comparison_parser(__doc__.splitlines()[0])
    args = p.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world > 1:
        dist.init_process_group("gloo")
    device = torch.device("cpu")
    try:
        tokenizer = build_tokenizer(args.model)
        raw = load_split(args.data, "train")
        raw = raw.subset(stratified_sample(raw.labels, args.train_samples, args.seed))
        dataset = AGNewsDataset(raw.texts, raw.labels, tokenizer, args.max_length)
        sampler: DistributedSampler[int] = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
        )
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=0)

        model = build_model(args.model, seed=args.seed, labels=AG_NEWS_LABELS).to(device)
        ddp_model = DDP(model) if world > 1 else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        total_steps = len(loader)
        scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(args.warmup_ratio * total_steps), total_steps)
        criterion = nn.CrossEntropyLoss()

        torch.manual_seed(args.seed + rank)
        ddp_model.train()
        sampler.set_epoch(0)
        losses, accs = AverageMeter(), AverageMeter()
        step_times = []
        started = time.time()
        for batch in loader:
            input_ids, attention_mask, labels = (batch[k].to(device) for k in ("input_ids", "attention_mask", "labels"))
            optimizer.zero_grad()
            logits = ddp_model(input_ids=input_ids, attention_mask=attention_mask).logits
            loss = criterion(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            losses.update(loss.item(), labels.size(0))
            accs.update((logits.argmax(dim=1) == labels).float().mean().item(), labels.size(0))
            step_times.append(time.time())
        train_time = time.time() - started

        env = DistEnv(rank, local_rank, world, world, device, "gloo" if world > 1 else None)
        test_raw = load_split(args.data, "test")
        test_raw = test_raw.subset(stratified_sample(test_raw.labels, args.eval_samples, args.seed))
        test = tokenize_cached(test_raw, tokenizer, args.max_length, None, build=True) if rank == 0 else None
        if world > 1:
            dist.barrier()
        if rank != 0:
            test = tokenize_cached(test_raw, tokenizer, args.max_length, None, build=False)
        metrics = evaluate(model, test, env, 128, Precision(device.type, None))
        if rank == 0:
            with open(args.result, "w") as fh:
                json.dump(
                    {
                        "step_times": step_times,
                        "train_start": started,
                        "train_time_s": train_time,
                        "steps": len(step_times),
                        "global_batch": args.batch_size * world,
                        "train_loss": losses.avg,
                        "train_accuracy": accs.avg,
                        "test": metrics,
                        "world_size": world,
                    },
                    fh,
                )
        if world > 1:
            dist.barrier()  # rank 0 wrote the result; leave together
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

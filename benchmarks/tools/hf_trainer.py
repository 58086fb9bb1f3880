"""Hugging Face ``Trainer`` set up to do what ``distrinews train`` does, for a fair speed comparison.

Same rows (our loader, seeded stratified sample, our token cache: identical token ids), same
model and head initialisation (``build_model``), same batch per device, maximum length,
learning rate, linear warm-up ratio, weight decay (Trainer also exempts biases and LayerNorm),
gradient clipping, bf16 autocast, length grouping (Trainer's ``LengthGroupedSampler``), fused
AdamW, dynamic padding (``DataCollatorWithPadding``), no checkpoints, no evaluation during
training, no reporting integrations. DDP over gloo when run under torchrun, as ours.
Afterwards the trained model is scored by the same exact evaluator as ours.

    torchrun --nproc-per-node 2 -m benchmarks.tools.hf_trainer --train-samples 3200 --result out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import (
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.data.splits import load_split, stratified_sample
from distrinews.data.tokenized import TokenizedDataset, tokenize_cached
from distrinews.distributed.process_group import DistEnv
from distrinews.model import build_model, build_tokenizer
from distrinews.train.evaluation import evaluate
from distrinews.train.precision import Precision

from .common import comparison_parser


class Rows(Dataset):
    """Our tokenized rows as the dicts Trainer expects (no padding: the collator pads per batch)."""

    def __init__(self, tokenized: TokenizedDataset):
        self.ds = tokenized

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids, label, _ = self.ds[i]
        return {"input_ids": ids.tolist(), "labels": label}


class StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.train_start: float | None = None
        self.step_times: list[float] = []

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.train_start = time.time()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.step_times.append(time.time())


def main() -> None:
    p = comparison_parser(__doc__.splitlines()[0])
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    if args.bf16 is None:
        from distrinews.distributed.machine import bf16_is_fast

        args.bf16 = bf16_is_fast("cpu")

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    tokenizer = build_tokenizer(args.model)
    raw = load_split(args.data, "train")
    raw = raw.subset(stratified_sample(raw.labels, args.train_samples, args.seed))
    # Every rank reads the same cache file; it was written by an earlier run or is written atomically here.
    train = tokenize_cached(raw, tokenizer, args.max_length, None, build=True)
    model = build_model(args.model, seed=args.seed, labels=AG_NEWS_LABELS)

    out_dir = tempfile.mkdtemp(prefix="hf-trainer-")
    targs = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=1,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_ratio,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        lr_scheduler_type="linear",
        optim="adamw_torch_fused",
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.seed,
        ddp_backend="gloo" if world > 1 else None,
        ddp_find_unused_parameters=False,
    )
    clock = StepClock()
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Rows(train),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[clock],
    )
    output = trainer.train()

    env = DistEnv(rank, local_rank, world, world, torch.device("cpu"), "gloo" if world > 1 else None)
    test_raw = load_split(args.data, "test")
    test_raw = test_raw.subset(stratified_sample(test_raw.labels, args.eval_samples, args.seed))
    test = tokenize_cached(test_raw, tokenizer, args.max_length, None, build=True)
    precision = Precision("cpu", torch.bfloat16 if args.bf16 else None)
    metrics = evaluate(trainer.model, test, env, 128, precision)
    if rank == 0:
        with open(args.result, "w") as fh:
            json.dump(
                {
                    "step_times": clock.step_times,
                    "train_start": clock.train_start,
                    "train_time_s": output.metrics.get("train_runtime"),
                    "steps": len(clock.step_times),
                    "global_batch": args.batch_size * world,
                    "train_loss": output.metrics.get("train_loss"),
                    "trainer_metrics": output.metrics,
                    "test": metrics,
                    "world_size": world,
                },
                fh,
            )
    if dist.is_initialized():
        dist.barrier()  # rank 0 wrote the result; leave together (a rank left alone in teardown can hang)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

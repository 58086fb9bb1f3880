"""Hugging Face ``Trainer`` set up to do what ``distrinews train`` does, for a fair speed comparison.

What it shares with ours and with the other peers (``training_peer``): the same rows, model and head
initialisation, batch per device, maximum length, learning rate, linear warm-up ratio, weight decay (Trainer
exempts biases and LayerNorm), gradient clipping, bf16 autocast, length grouping (Trainer's
``LengthGroupedSampler``), fused AdamW, dynamic padding (``DataCollatorWithPadding``); no checkpoints, no
evaluation during training, no reporting integrations. DDP over gloo when run under torchrun, as ours.
Afterwards the trained model is scored by the same exact evaluator as ours.

    torchrun --nproc-per-node 2 -m benchmarks.tools.hf_trainer --train-samples 3200 --result out.json
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .training_peer import Rows, Setup, StepTimes, collator, leave, parse_args, score_and_report, setup


class StepClock(TrainerCallback):
    """``StepTimes`` as Trainer's callback: its loop begins at ``on_train_begin``, a step ends at ``on_step_end``."""

    def __init__(self) -> None:
        self.times = StepTimes()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.times.start()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.times.step()


def training_arguments(s: Setup) -> TrainingArguments:
    args = s.args
    return TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=1,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_ratio,  # below 1: a ratio of the steps, rounded up
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
        ddp_backend="gloo" if s.world > 1 else None,
        ddp_find_unused_parameters=False,
    )


def main() -> None:
    s = setup(parse_args(__doc__.splitlines()[0]))
    clock = StepClock()
    trainer = Trainer(
        model=s.model,
        args=training_arguments(s),
        train_dataset=Rows(s.train),
        data_collator=collator(s),
        callbacks=[clock],
    )
    output = trainer.train()
    score_and_report(
        s,
        s.model,  # trained in place: Trainer wraps it for DDP, the weights are these
        clock.times,
        train_time_s=output.metrics.get("train_runtime"),
        train_loss=output.metrics.get("train_loss"),
        trainer_metrics=output.metrics,
    )
    leave()


if __name__ == "__main__":
    main()

"""A plain Hugging Face Accelerate loop doing what ``distrinews train`` does, for a fair speed comparison.

``Accelerator()``, ``accelerator.prepare(model, optimizer, loader)``, ``accelerator.backward`` and
``accelerator.clip_grad_norm_``: the loop of Accelerate's own examples, for one epoch. Launched by torchrun, which
Accelerate reads as it reads its own launcher's environment (``accelerate launch --cpu`` starts a single process:
several CPU processes go through mpirun there); on CPU it makes a gloo process group. What it shares with ours
and the other peers (``training_peer``): the rows, model and head initialisation, batch per process, maximum
length, dynamic padding, length grouping (transformers' ``LengthGroupedSampler`` over every row, the batches dealt
to the ranks by ``prepare``, as under Trainer), fused AdamW with Trainer's weight-decay groups, the linear warm-up
and decay over the prepared loader's steps, gradient clipping, and ``mixed_precision="bf16"`` where the machine
computes bf16 in hardware (else ``"no"``). Afterwards the trained model is scored by the same exact evaluator as
ours.

    torchrun --nproc-per-node 2 -m benchmarks.tools.accelerate_loop --train-samples 3200 --result out.json
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from .training_peer import (
    Rows,
    Setup,
    StepTimes,
    collator,
    leave,
    optimizer,
    parse_args,
    schedule,
    score_and_report,
    setup,
    whole_sampler,
)


def train(s: Setup, accelerator: Accelerator, times: StepTimes) -> tuple[torch.nn.Module, float]:
    """One epoch; the model as prepared, and the mean training loss over every rank's steps."""
    loader = DataLoader(Rows(s.train), batch_size=s.args.batch_size, sampler=whole_sampler(s), collate_fn=collator(s))
    model, opt, loader = accelerator.prepare(s.model, optimizer(s.model, s.args), loader)
    # built on the prepared loader's length and not prepared itself: one scheduler step per optimizer step over
    # this rank's steps, the warm-up and decay Trainer builds (a prepared scheduler steps once per process instead)
    scheduler = schedule(opt, s.args, len(loader))
    model.train()
    total = torch.zeros(())
    times.start()
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), s.args.max_grad_norm)
        opt.step()
        scheduler.step()
        opt.zero_grad()
        total += loss.detach().float()
        times.step()
    return model, float(accelerator.reduce(total / max(1, len(times.step_times)), reduction="mean"))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    accelerator = Accelerator(mixed_precision="bf16" if args.bf16 else "no", cpu=not torch.cuda.is_available())
    set_seed(args.seed)
    s = setup(args)
    times = StepTimes()
    model, train_loss = train(s, accelerator, times)
    score_and_report(s, accelerator.unwrap_model(model), times, train_loss=train_loss)
    leave()


if __name__ == "__main__":
    main()

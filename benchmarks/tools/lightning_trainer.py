"""PyTorch Lightning's ``Trainer`` doing what ``distrinews train`` does, for a fair speed comparison.

A ``LightningModule`` around the same model, ``lightning.Trainer(accelerator="cpu", strategy="ddp")`` for one
epoch, run under torchrun as Lightning documents for a launcher of one's own (it reads torchrun's environment
and starts no processes itself; ``devices`` x ``num_nodes`` match torchrun's processes). DDP over gloo, Lightning's
choice on CPU. What it shares with ours and the other peers (``training_peer``): the rows, model and head
initialisation, batch per process, maximum length, dynamic padding, length grouping (transformers'
``DistributedLengthGroupedSampler``, given with ``use_distributed_sampler=False``: Lightning's own wrapper would
shuffle the grouped order away), fused AdamW with Trainer's weight-decay groups, the linear warm-up and decay
stepped every optimizer step, gradient clipping by norm (in ``on_before_optimizer_step``), precision
``bf16-mixed`` where the machine computes bf16 in hardware (else ``32-true``). As Trainer is set up here: no
checkpoints, no logger, no progress bar, no validation. Afterwards the trained model is scored by the same exact
evaluator as ours.

    torchrun --nproc-per-node 2 -m benchmarks.tools.lightning_trainer --train-samples 3200 --result out.json
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from .training_peer import (
    Rows,
    Setup,
    StepTimes,
    collator,
    leave,
    optimizer,
    parse_args,
    rank_sampler,
    schedule,
    score_and_report,
    setup,
)


class Classifier(L.LightningModule):
    """The model, its optimizer and its schedule, as a Lightning user writes them."""

    def __init__(self, s: Setup):
        super().__init__()
        self.model = s.model
        self.args = s.args

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.model(**batch).loss
        # one value an epoch, reduced over the ranks once at its end (not a collective a step)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(batch["labels"]))
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Clipping here, not with Trainer(gradient_clip_val=...): Lightning refuses that with a fused optimizer under
        # its mixed-precision plugin (an fp16 scaler could not unscale first); bf16 has no scaler, and this hook runs
        # after any unscaling, where its documentation puts a clip of one's own.
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)

    def configure_optimizers(self) -> Any:
        opt = optimizer(self.model, self.args)
        steps = int(self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule(opt, self.args, steps), "interval": "step"}}


class StepClock(L.Callback):
    """``StepTimes`` as Lightning's callback: the loop begins at ``on_train_start``, a step ends (after its optimizer
    step) at ``on_train_batch_end``."""

    def __init__(self) -> None:
        self.times = StepTimes()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.times.start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.times.step()


def lightning_trainer(s: Setup, clock: StepClock) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        strategy="ddp" if s.world > 1 else "auto",
        devices=s.local_world,
        num_nodes=s.world // s.local_world,
        precision="bf16-mixed" if s.args.bf16 else "32-true",
        max_epochs=1,
        use_distributed_sampler=False,
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def main() -> None:
    s = setup(parse_args(__doc__.splitlines()[0]))
    L.seed_everything(s.args.seed, verbose=False)
    loader = DataLoader(Rows(s.train), batch_size=s.args.batch_size, sampler=rank_sampler(s), collate_fn=collator(s))
    clock = StepClock()
    trainer = lightning_trainer(s, clock)
    module = Classifier(s)
    trainer.fit(module, train_dataloaders=loader)
    loss = trainer.callback_metrics.get("train_loss")
    score_and_report(s, module.model, clock.times, train_loss=None if loss is None else float(loss))
    leave()


if __name__ == "__main__":
    main()

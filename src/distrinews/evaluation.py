"""Exact evaluation: every test row scored by exactly one rank, counts summed across ranks."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from .config import TrainConfig
from .data import Collator, TokenizedDataset, eval_shard
from .distributed import DistEnv, all_reduce_sum
from .metrics import classification_metrics, confusion_matrix


def autocast_context(config: TrainConfig, device: torch.device):
    if config.bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if config.fp16:
        return torch.autocast(device_type=device.type, dtype=torch.float16)
    return contextlib.nullcontext()


@torch.inference_mode()
def evaluate(model: torch.nn.Module, dataset: TokenizedDataset, env: DistEnv, config: TrainConfig,
             label_names: tuple[str, ...] | list[str] | None = None) -> dict[str, Any]:
    """Loss, accuracy, macro-F1 and per-class accuracy over the whole dataset, for any world size.

    ``model`` must be the unwrapped module: ranks see different numbers of batches, so no
    forward pass here may talk to the other ranks. The only collectives are the two sums at the end.
    """
    was_training = model.training
    model.eval()
    num_labels = model.config.num_labels
    shard = eval_shard(dataset.lengths, env.rank, env.world_size)
    loader = DataLoader(dataset, batch_size=config.per_device_eval_batch_size, sampler=shard, collate_fn=Collator(dataset.pad_token_id))
    confusion = torch.zeros(num_labels, num_labels, dtype=torch.int64, device=env.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
    for batch in loader:
        batch = {k: v.to(env.device, non_blocking=True) for k, v in batch.items()}
        with autocast_context(config, env.device):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, batch["labels"], reduction="sum").double()
        confusion += confusion_matrix(logits.argmax(-1), batch["labels"], num_labels)
    all_reduce_sum(confusion, env)
    all_reduce_sum(loss_sum, env)
    model.train(was_training)
    names = label_names or [model.config.id2label[i] for i in range(num_labels)]
    return classification_metrics(confusion, loss_sum.item(), names)

"""Rows into a batch: padded to the batch's own longest row (dynamic padding), with each row's index in its split."""

from __future__ import annotations

import torch


class Collator:
    """Pad each batch to its own longest row (dynamic padding), rounded up to ``pad_to_multiple_of``.

    Rows are ``TokenizedDataset`` items, ``(ids, label, index)``; ``index`` is how a per-row table (a
    distillation teacher's probabilities, ``train.distillation``) finds a batch's rows."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id = pad_token_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, batch: list[tuple[torch.Tensor, int | torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        longest = max(ids.numel() for ids, _, _ in batch)
        longest = -(-longest // self.multiple) * self.multiple
        input_ids = torch.full((len(batch), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, (ids, _, _) in enumerate(batch):
            input_ids[row, : ids.numel()] = ids
            attention_mask[row, : ids.numel()] = 1
        targets = [y for _, y, _ in batch]
        multi_hot = [y for y in targets if isinstance(y, torch.Tensor)]  # multi-label rows: float 0/1 each
        labels = torch.stack(multi_hot) if multi_hot else torch.tensor(targets, dtype=torch.long)
        index = torch.tensor([i for _, _, i in batch], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "index": index}

"""Batched inference over a checkpoint directory (or the seed's ``.pt`` file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checkpoint import load_for_inference


class Predictor:
    """Tokenize with dynamic padding, one forward pass per batch, softmax, named labels."""

    runtime = "torch"

    def __init__(self, checkpoint: str | os.PathLike, device: str | torch.device | None = None, max_batch_size: int = 64):
        self.checkpoint = Path(checkpoint)
        self.model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self.max_length = int(self.info.get("max_length", 128))
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.max_batch_size = max_batch_size

    @torch.inference_mode()
    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        return self.model(**enc).logits.float().cpu()

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text, in order. Texts are grouped by length so each batch pads little."""
        if isinstance(texts, str):
            raise TypeError("predict() takes a list of texts")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        results: list[dict[str, Any] | None] = [None] * len(texts)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            probs = torch.softmax(self.logits([texts[i] for i in chunk]), dim=-1)
            for i, p in zip(chunk, probs):
                results[i] = self.format(p)
        return results  # type: ignore[return-value]

    def format(self, probs: torch.Tensor) -> dict[str, Any]:
        label_id = int(probs.argmax())
        return {
            "label": self.labels[label_id],
            "label_id": label_id,
            "confidence": float(probs[label_id]),
            "probabilities": {name: float(probs[i]) for i, name in enumerate(self.labels)},
        }

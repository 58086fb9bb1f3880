"""A split tokenized once: token ids stored flat, cached as safetensors keyed by the rows and the tokenizer."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

from .cache_dir import default_cache_dir
from .rows import RawSplit

if TYPE_CHECKING:  # transformers is imported where a tokenizer is built
    from transformers import PreTrainedTokenizerBase


@dataclass(eq=False)  # compared and hashed as the object it is, never by its tensors
class TokenizedDataset(Dataset[tuple[torch.Tensor, int | torch.Tensor, int]]):
    """Token ids stored flat (one int32 tensor + offsets): small, fast to cache and to slice."""

    flat_ids: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    pad_token_id: int

    def __len__(self) -> int:
        return self.labels.shape[0]

    @property
    def multi_label(self) -> bool:
        return self.labels.dim() == 2

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int | torch.Tensor, int]:
        """(token ids, label, i): the row's index travels with it into the batch (``collate.Collator``). The label
        of a multi-label row is its float 0/1 vector, the targets of the binary cross-entropy."""
        label = self.labels[i] if self.multi_label else int(self.labels[i])
        return self.flat_ids[self.offsets[i] : self.offsets[i + 1]], label, int(i)

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def _cache_key(split: RawSplit, tokenizer: PreTrainedTokenizerBase, max_length: int) -> str:
    h = hashlib.sha256()
    h.update(f"v1|{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|{max_length}|".encode())
    vocabulary = "\x1f".join(tokenizer.convert_ids_to_tokens(list(range(0, len(tokenizer), 97))))  # every 97th
    h.update(hashlib.sha256(vocabulary.encode()).digest())
    for text, label in zip(split.texts, split.labels):
        h.update(f"{label}\x1e{text}\x1f".encode())
    return h.hexdigest()[:24]


def tokenize(split: RawSplit, tokenizer: PreTrainedTokenizerBase, max_length: int) -> TokenizedDataset:
    enc = tokenizer(split.texts, truncation=True, max_length=max_length, padding=False, return_attention_mask=False)
    ids = enc["input_ids"]
    lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
    labels = torch.tensor(split.labels, dtype=torch.float32 if split.multi_label else torch.int64)
    return TokenizedDataset(flat, offsets, labels, tokenizer.pad_token_id)


def tokenize_cached(
    split: RawSplit,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cache_dir: str | os.PathLike[str] | None,
    build: bool,
) -> TokenizedDataset:
    """Load the tokenized split from the cache; if ``build`` and it is missing (or damaged), tokenize and write it
    atomically. One process per node builds while the others wait at a barrier, then read (``build=False``)."""
    directory = Path(cache_dir) if cache_dir else default_cache_dir()
    path = directory / f"agnews-{_cache_key(split, tokenizer, max_length)}.safetensors"
    if path.is_file():
        try:
            t = load_file(str(path))
            return TokenizedDataset(t["flat_ids"], t["offsets"], t["labels"], tokenizer.pad_token_id)
        except Exception:
            if not build:
                raise
            # A corrupt cache entry is rebuilt, never trusted.
    if not build:
        raise FileNotFoundError(f"tokenized cache {path} was not built by the main process")
    ds = tokenize(split, tokenizer, max_length)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({"flat_ids": ds.flat_ids, "offsets": ds.offsets, "labels": ds.labels}, str(tmp))
    os.replace(tmp, path)
    return ds

"""Which rows a run reads: the train or test split, from ``--data`` / ``$DISTRINEWS_DATA`` or else the hub, and a seeded
sample of them."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from .csv_files import read_csv, split_files
from .hub import load_from_hub
from .rows import DATA_ENV, RawSplit


def resolve_data_dir(data_dir: str | None) -> Path | None:
    """``--data`` first, then ``$DISTRINEWS_DATA``; None means "use the hub"."""
    chosen = data_dir or os.environ.get(DATA_ENV) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data directory {path} does not exist. Point --data (or ${DATA_ENV}) at a directory holding "
            "AG News as train.csv[.gz] and test.csv[.gz] (class,title,description; no header)"
        )
    return path


def load_split(data_dir: str | None, split: str) -> RawSplit:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    path = resolve_data_dir(data_dir)
    if path is None:
        return load_from_hub(split)
    files = split_files(path, split)
    if not files:
        raise DataError(
            f"{path} has no {split}.csv or {split}.csv.gz; point --data (or ${DATA_ENV}) at an AG News directory"
        )
    parts = [read_csv(f) for f in files]
    return RawSplit(
        [t for p in parts for t in p.texts],
        [y for p in parts for y in p.labels],
        "+".join(p.source for p in parts),
        [w for p in parts for w in p.where or []],
    )


def stratified_sample(labels: Sequence[Hashable], n: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample with each class in proportion; all indices when n is None or too big."""
    if n is None or n >= len(labels):
        return list(range(len(labels)))
    gen = torch.Generator().manual_seed(seed)
    by_class: dict[Any, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    total = len(labels)
    # Largest-remainder apportionment: quotas sum to exactly n.
    quotas = {c: n * len(ix) / total for c, ix in by_class.items()}
    take = {c: int(q) for c, q in quotas.items()}
    for c in sorted(quotas, key=lambda c: quotas[c] - take[c], reverse=True)[: n - sum(take.values())]:
        take[c] += 1
    chosen: list[int] = []
    for c in sorted(by_class):
        ix = by_class[c]
        perm = torch.randperm(len(ix), generator=gen)[: take[c]]
        chosen.extend(ix[int(j)] for j in perm)
    return sorted(chosen)


def hold_out(labels: Sequence[int], percentage: int, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held): a seeded, class-stratified ``percentage`` of the rows held out, at least one row of each class
    that has two or more (a class with a single row stays where it is: in the kept rows)."""
    counts = Counter(labels)
    eligible = [i for i, y in enumerate(labels) if counts[y] > 1]
    classes = sum(1 for n in counts.values() if n > 1)
    n = min(len(eligible) - classes, max(classes, round(len(labels) * percentage / 100)))
    if n <= 0:
        return list(range(len(labels))), []
    held = sorted(eligible[j] for j in stratified_sample([labels[i] for i in eligible], n, seed))
    chosen = set(held)
    return [i for i in range(len(labels)) if i not in chosen], held

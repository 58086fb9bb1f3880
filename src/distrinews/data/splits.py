"""Which rows a run reads: AG News's train or test split, from ``--data`` / ``$DISTRINEWS_DATA`` or else the hub, each
checked row by row (a malformed row fails with ``file:line`` and what is wrong), and a seeded sample of them.

The local form is the original release: CSV without a header, 3 columns (class 1-4, title, description),
``train.csv[.gz]`` plus any ``train-*.csv[.gz]`` shards, and ``test.csv[.gz]``. The hub's is ``fancyzhx/ag_news``
through ``datasets``, when no local copy is given.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import socket
import urllib.parse
from collections import Counter
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from .rows import AG_NEWS_LABELS as LABELS
from .rows import DATA_ENV, GET_DATA, HUB_DATASET, RawSplit, clean_text


# ---------------------------------------------------------------------- local CSV files
def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_csv(path: str | os.PathLike[str]) -> RawSplit:
    """Read one AG News CSV; a malformed row fails with ``file:line`` and what is wrong."""
    path = Path(path)
    wheres: list[str] = []
    rows = RawSplit([], [], str(path), wheres)
    try:
        with _open_text(path) as fh:
            reader = csv.reader(fh)
            start = 1
            for row in reader:
                where = f"{path}:{start}"
                start = reader.line_num + 1
                if not row or row == [""]:
                    continue
                if len(row) != 3:
                    raise DataError(f"{where}: expected 3 columns (class, title, description), found {len(row)}")
                raw_label, title, description = row
                try:
                    label = int(raw_label.strip())
                except ValueError:
                    raise DataError(f"{where}: class {raw_label!r} is not an integer 1-{len(LABELS)}") from None
                if not 1 <= label <= len(LABELS):
                    raise DataError(f"{where}: class {label} is outside 1-{len(LABELS)}")
                text = clean_text(title, description)
                if not text:
                    raise DataError(f"{where}: empty text (title and description are both blank)")
                rows.texts.append(text)
                rows.labels.append(label - 1)
                wheres.append(where)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (csv.Error, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot parse: {exc}") from None
    if not rows.labels:
        raise DataError(f"{path}: no rows")
    return rows


def split_files(data_dir: Path, split: str) -> list[Path]:
    files = next(([p] for p in (data_dir / f"{split}.csv", data_dir / f"{split}.csv.gz") if p.is_file()), [])
    if split == "train":
        files += sorted(p for p in data_dir.glob("train-*.csv*") if p.name.endswith((".csv", ".csv.gz")))
    return files


# ---------------------------------------------------------------------- the hub
def _hub_offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached, when that is known at once (its name does not resolve; ``datasets`` would retry
    for ~25 s first), else None. Behind a proxy the name may resolve only at the proxy: nothing is probed."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        return f"{host} does not resolve ({exc.strerror or exc})"
    return None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def load_from_hub(split: str) -> RawSplit:
    """``fancyzhx/ag_news`` through ``datasets`` (which caches it; offline, a copy an earlier run cached is read). Its
    rows are the original CSV's joined with the release's escapes still in them, so they are cleaned like the local
    files: the same article gives the same text (and token cache entry) either way."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"no data directory given, and the hub path needs the 'datasets' package (not installed); {GET_DATA}"
        ) from None
    unreachable = None if _hub_offline() else _hub_unreachable()
    if unreachable:
        raise DataError(
            f"no data directory given and the Hugging Face hub cannot be reached ({unreachable}; with "
            f"HF_HUB_OFFLINE=1 a copy an earlier run downloaded is read from the cache); {GET_DATA}"
        )
    try:
        ds = datasets.load_dataset(HUB_DATASET, split=split)
    except Exception as exc:  # network, offline mode, auth, a moved dataset: all leave the user the same two ways
        why = (
            "the hub is offline (HF_HUB_OFFLINE=1) and no copy is cached" if _hub_offline() else "could not download it"
        )
        raise DataError(
            f"no data directory given and {HUB_DATASET} is not available: {why} ({_first_line(exc)}); {GET_DATA}"
        ) from None
    where = f"hub:{HUB_DATASET}/{split}"
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise DataError(f"{where}: expected columns text and label, missing {sorted(missing)}")
    texts, labels = [], []
    for i, (raw_text, label) in enumerate(zip(ds["text"], ds["label"])):
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(LABELS):
            raise DataError(f"{where} row {i}: label {label!r} is not an integer 0-{len(LABELS) - 1}")
        text = clean_text(raw_text or "", "")
        if not text:
            raise DataError(f"{where} row {i}: empty text")
        texts.append(text)
        labels.append(label)
    if not labels:
        raise DataError(f"{where}: no rows")
    return RawSplit(texts, labels, where, [f"{where} row {i}" for i in range(len(labels))])


# ---------------------------------------------------------------------- the split and a sample of it
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

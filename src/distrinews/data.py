"""AG News: read, check, sample, tokenize once (cached), shard, and batch with dynamic padding.

The local form is the original release: CSV without a header, 3 columns (class 1-4, title,
description), ``train.csv[.gz]`` plus any ``train-*.csv[.gz]`` shards, and ``test.csv[.gz]``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset, DistributedSampler

from .errors import DataError
from .model import LABELS

DATA_ENV = "DISTRINEWS_DATA"
CACHE_ENV = "DISTRINEWS_CACHE"
HUB_DATASET = "fancyzhx/ag_news"


@dataclass
class RawSplit:
    texts: list[str]
    labels: list[int]  # 0-based class ids
    source: str

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: Sequence[int]) -> "RawSplit":
        return RawSplit([self.texts[i] for i in indices], [self.labels[i] for i in indices], self.source)


# ------------------------------------------------------------------ reading
_ESCAPED_DOLLAR = re.compile(r"\\\$")
_BACKSLASH_BREAK = re.compile(r"\\+n?(?=[A-Z\s\"']|$)|\\+")
_SPACES = re.compile(r"\s+")


def clean_text(title: str, description: str) -> str:
    """Title + " " + description, with the original release's escapes undone.

    The release replaced line breaks with a backslash (``dwindling\\band`` is "dwindling band")
    and sometimes wrote them as a literal ``\\n``; ``\\$`` is an escaped dollar sign; ``#39;``
    and ``quot;`` are the remains of HTML entities.
    """
    text = f"{title} {description}"
    text = _ESCAPED_DOLLAR.sub("$", text)
    text = _BACKSLASH_BREAK.sub(" ", text)
    text = (
        text.replace(" #39;", "'")
        .replace("#39;", "'")
        .replace(" quot;", ' "')
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
    )
    return _SPACES.sub(" ", text).strip()


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_csv(path: str | os.PathLike) -> RawSplit:
    """Read one AG News CSV; a malformed row fails with ``file:line`` and what is wrong."""
    path = Path(path)
    texts: list[str] = []
    labels: list[int] = []
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
                texts.append(text)
                labels.append(label - 1)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (csv.Error, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot parse: {exc}") from None
    if not labels:
        raise DataError(f"{path}: no rows")
    return RawSplit(texts, labels, str(path))


def _split_files(data_dir: Path, split: str) -> list[Path]:
    def first(name: str) -> list[Path]:
        for candidate in (data_dir / f"{name}.csv", data_dir / f"{name}.csv.gz"):
            if candidate.is_file():
                return [candidate]
        return []

    files = first(split)
    if split == "train":
        files += sorted(p for p in data_dir.glob("train-*.csv*") if p.name.endswith((".csv", ".csv.gz")))
    return files


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
        return _load_from_hub(split)
    files = _split_files(path, split)
    if not files:
        raise DataError(f"{path} has no {split}.csv or {split}.csv.gz; point --data (or ${DATA_ENV}) at an AG News directory")
    parts = [read_csv(f) for f in files]
    return RawSplit(
        [t for p in parts for t in p.texts],
        [y for p in parts for y in p.labels],
        "+".join(p.source for p in parts),
    )


# Both ways to get the data, for every message that has to say none was found.
GET_DATA = (
    f"get AG News either way: pass --data DIR (or set ${DATA_ENV}) to a directory holding train.csv[.gz] and test.csv[.gz] "
    f"in the original layout (class 1-4, title, description; no header), or run where the Hugging Face hub is reachable, "
    f"which downloads {HUB_DATASET} once and caches it (needs `pip install 'distrinews[hub]'`)"
)


def _hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here, when that is known at once (its host name does not
    resolve), else None. Without this, ``datasets`` retries for ~25 s before failing the same way.
    Behind a proxy the name may resolve only at the proxy, so nothing is probed there."""
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


def _load_from_hub(split: str) -> RawSplit:
    """``fancyzhx/ag_news`` through ``datasets`` (cached by it after the first download).

    The hub's rows are the original CSV's, joined as ``title + " " + description`` with the
    release's escapes still in them, so they are cleaned exactly like the local files: the same
    article gives the same text (and the same token cache entry) either way. Offline
    (``HF_HUB_OFFLINE=1``), ``datasets`` still reads a copy an earlier run cached.
    """
    try:
        import datasets
    except ImportError:
        raise DataError(f"no data directory given, and the hub path needs the 'datasets' package (not installed); {GET_DATA}") from None
    unreachable = None if _hub_offline() else _hub_unreachable()
    if unreachable:
        raise DataError(
            f"no data directory given and the Hugging Face hub cannot be reached ({unreachable}; with HF_HUB_OFFLINE=1 a copy "
            f"an earlier run downloaded is read from the cache); {GET_DATA}"
        )
    try:
        ds = datasets.load_dataset(HUB_DATASET, split=split)
    except Exception as exc:  # network, offline mode, auth, a moved dataset: all leave the user the same two ways
        why = "the hub is offline (HF_HUB_OFFLINE=1) and no copy is cached" if _hub_offline() else "could not download it"
        raise DataError(f"no data directory given and {HUB_DATASET} is not available: {why} ({_first_line(exc)}); {GET_DATA}") from None
    where = f"hub:{HUB_DATASET}/{split}"
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise DataError(f"{where}: expected columns text and label, missing {sorted(missing)}")
    texts: list[str] = []
    labels: list[int] = []
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
    return RawSplit(texts, labels, where)


def stratified_sample(labels: Sequence[int], n: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample with each class in proportion; all indices when n is None or too big."""
    if n is None or n >= len(labels):
        return list(range(len(labels)))
    gen = torch.Generator().manual_seed(seed)
    by_class: dict[int, list[int]] = {}
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


# ------------------------------------------------------------------ tokenizing
class TokenizedDataset(Dataset):
    """Token ids stored flat (one int32 tensor + offsets): small, fast to cache and to slice."""

    def __init__(self, flat_ids: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor, pad_token_id: int):
        self.flat_ids = flat_ids
        self.offsets = offsets
        self.labels = labels
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.flat_ids[self.offsets[i] : self.offsets[i + 1]], int(self.labels[i])

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def _cache_key(split: RawSplit, tokenizer, max_length: int) -> str:
    h = hashlib.sha256()
    h.update(f"v1|{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|{max_length}|".encode())
    h.update(hashlib.sha256("\x1f".join(tokenizer.convert_ids_to_tokens(list(range(0, len(tokenizer), 97)))).encode()).digest())
    for text, label in zip(split.texts, split.labels):
        h.update(f"{label}\x1e{text}\x1f".encode())
    return h.hexdigest()[:24]


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "distrinews")


def tokenize(split: RawSplit, tokenizer, max_length: int) -> TokenizedDataset:
    enc = tokenizer(split.texts, truncation=True, max_length=max_length, padding=False, return_attention_mask=False)
    ids = enc["input_ids"]
    lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
    return TokenizedDataset(flat, offsets, torch.tensor(split.labels, dtype=torch.int64), tokenizer.pad_token_id)


def tokenize_cached(split: RawSplit, tokenizer, max_length: int, cache_dir: str | os.PathLike | None, build: bool) -> TokenizedDataset:
    """Load the tokenized split from the cache; if ``build`` and it is missing, tokenize and write it atomically.

    The caller makes one process per node build (``build=True``) while the others wait at a
    barrier and then read (``build=False``).
    """
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


# ------------------------------------------------------------------ batching
class Collator:
    """Pad each batch to its own longest row (dynamic padding), rounded up to ``pad_to_multiple_of``."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id = pad_token_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, batch: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        longest = max(ids.numel() for ids, _ in batch)
        longest = -(-longest // self.multiple) * self.multiple
        input_ids = torch.full((len(batch), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : ids.numel()] = ids
            attention_mask[row, : ids.numel()] = 1
        labels = torch.tensor([y for _, y in batch], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class TrainSampler(DistributedSampler):
    """``DistributedSampler`` with optional length grouping and a resume offset.

    Without grouping it is torch's sampler (rank r takes every world-size-th index of a seeded
    per-epoch permutation). ``batch_size`` is a rank's rows per optimizer step (per-device batch x
    accumulation steps). With grouping, the permutation is cut into mega-batches of
    ``50 x batch x world`` rows, each sorted by length, then cut into global batches of
    ``batch x world`` that are dealt out round-robin: every rank's batch k has rows of similar
    length, and the union of the ranks' batch k is the same set of rows whatever the split of
    the global batch into ranks, so 2 x B and 1 x 2B see the same samples.
    ``set_epoch(epoch, skip=n)`` drops this rank's first n samples (resume mid-epoch).
    """

    MEGABATCH_MULT = 50

    def __init__(self, dataset: TokenizedDataset, num_replicas: int, rank: int, batch_size: int, seed: int, group_by_length: bool):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.batch_size = batch_size
        self.group_by_length = group_by_length
        self.lengths = dataset.lengths
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def _rank_indices(self) -> list[int]:
        if not self.group_by_length:
            return list(super().__iter__())
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g).tolist()
        order += order[: self.total_size - len(order)]  # pad like DistributedSampler
        global_batch = self.batch_size * self.num_replicas
        mega = global_batch * self.MEGABATCH_MULT
        mine: list[int] = []
        for start in range(0, len(order), mega):
            chunk = order[start : start + mega]
            chunk.sort(key=lambda i: -int(self.lengths[i]))  # stable: ties keep permutation order
            for b in range(0, len(chunk), global_batch):
                mine.extend(chunk[b : b + global_batch][self.rank :: self.num_replicas])
        return mine

    def __iter__(self) -> Iterator[int]:
        return iter(self._rank_indices()[self.skip :])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def eval_shard(lengths: torch.Tensor, rank: int, world_size: int) -> list[int]:
    """This rank's share of the eval rows, no padding and no duplicates, longest first.

    Every row belongs to exactly one rank (i % world_size == rank), so summing the ranks'
    counts gives exact metrics for any world size.
    """
    mine = list(range(rank, lengths.numel(), world_size))
    mine.sort(key=lambda i: -int(lengths[i]))
    return mine


def steps_per_epoch(num_rows: int, world_size: int, batch_size: int, grad_accum: int) -> int:
    per_rank = math.ceil(num_rows / world_size)
    micro = math.ceil(per_rank / batch_size)
    return math.ceil(micro / grad_accum)

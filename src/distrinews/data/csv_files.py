"""AG News from local CSV files, checked row by row: a malformed row fails with ``file:line`` and what is wrong.

The local form is the original release: CSV without a header, 3 columns (class 1-4, title,
description), ``train.csv[.gz]`` plus any ``train-*.csv[.gz]`` shards, and ``test.csv[.gz]``.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from pathlib import Path

from ..errors import DataError
from .rows import AG_NEWS_LABELS as LABELS
from .rows import RawSplit, clean_text


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_csv(path: str | os.PathLike[str]) -> RawSplit:
    """Read one AG News CSV; a malformed row fails with ``file:line`` and what is wrong."""
    path = Path(path)
    texts: list[str] = []
    labels: list[int] = []
    wheres: list[str] = []
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
                wheres.append(where)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (csv.Error, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: cannot parse: {exc}") from None
    if not labels:
        raise DataError(f"{path}: no rows")
    return RawSplit(texts, labels, str(path), wheres)


def split_files(data_dir: Path, split: str) -> list[Path]:
    def first(name: str) -> list[Path]:
        for candidate in (data_dir / f"{name}.csv", data_dir / f"{name}.csv.gz"):
            if candidate.is_file():
                return [candidate]
        return []

    files = first(split)
    if split == "train":
        files += sorted(p for p in data_dir.glob("train-*.csv*") if p.name.endswith((".csv", ".csv.gz")))
    return files

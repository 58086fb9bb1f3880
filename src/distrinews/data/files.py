"""Corpus files for batch inference: JSONL, CSV with a header, or Parquet, read row by row without stopping at a bad
one.

An input is a file, a folder (its files of a known format by name; hidden files, ``_``-files such as ``_SUCCESS``
and subfolders left out) or a glob; its format is its suffix (``SUFFIXES``).

:func:`read_rows` yields one :class:`RawRow` per row, in file order, and never raises on bad content: a line not
UTF-8 or not a JSON object, a CSV record with the wrong number of fields, a row over ``max_row_bytes``, a truncated
gzip stream, an unreadable Parquet value or row group is a row with ``error`` set (``file:line`` and the start of
the raw text kept for the rejects file). Blank lines are not rows. So every reader, :func:`count_rows` included,
numbers a file's rows alike, and can start at row N (``start=N``) without parsing the rows before it.

Memory is bounded: a line or CSV record is read ``max_row_bytes`` at most (the rest skipped in small chunks, to the
end of its quoted field), and a Parquet row group is decoded only when its columns take at most ``max_row_bytes`` a
row and ``PARQUET_GROUP_BYTES`` in all, uncompressed. Lines are 1-based physical lines (a CSV record: the line it
starts on; the header is line 1); for Parquet, the row's 1-based position in the file.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

SUFFIXES = {".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".csv": "csv", ".csv.gz": "csv", ".parquet": "parquet"}
KNOWN = ", ".join(SUFFIXES)
PARQUET_EXTRA = "parquet"
PARQUET_BATCH = 1024  # rows decoded at a time: memory stays bounded whatever the row group size
RAW_LIMIT = 10_000  # characters of a bad row kept for the rejects file
# The largest row read (a JSONL line, a CSV record, a Parquet row's fields read), in bytes. Rows hold more than
# their text (other fields, JSON escapes up to 6 bytes a character): 1 MiB keeps any row whose text the server's
# 10,000-character limit allows, with room to spare, and is what one reader holds at most for a row.
MAX_ROW_BYTES = 1 << 20
PARQUET_GROUP_BYTES = 1 << 30  # the most a row group's columns read may take uncompressed: the Parquet reader's bound
_SKIP_CHUNK = 1 << 16  # the rest of an oversized line is read (and dropped) this much at a time
_STREAM_ERRORS = (EOFError, OSError, zlib.error)  # gzip.BadGzipFile is an OSError
_SURROGATE = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, as surrogateescape decodes them
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Shard:
    """One input file and its format."""

    path: Path
    format: str  # one of SUFFIXES' values


@dataclass
class RawRow:
    """One row as read: its fields (a dict), or why it could not be read (``error``), and its raw text."""

    line: int
    fields: dict[str, Any] | None
    error: str | None = None
    raw: str = ""


def format_of(path: str | os.PathLike[str]) -> str | None:
    """``jsonl``, ``csv`` or ``parquet`` from the file name's suffix, else None."""
    name = Path(path).name.lower()
    return next((fmt for suffix, fmt in SUFFIXES.items() if name.endswith(suffix) and len(name) > len(suffix)), None)


def require_pyarrow(what: str) -> None:
    """Fail in one line, naming the extra, when pyarrow (Parquet) is not installed."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(f"{what} needs pyarrow: pip install 'distrinews[{PARQUET_EXTRA}]'")


def resolve_inputs(specs: Iterable[str], what: str = "--input") -> list[Shard]:
    """The files ``specs`` name (files, folders, globs), in order, each once; one-line ``ConfigError`` (naming the
    option ``what``) otherwise. A file must have a known suffix; a folder or a glob gives its files of one."""
    shards: dict[Path, Shard] = {}  # by resolved path: each file once
    for spec in specs:
        for path in _expand(spec, what):
            if (resolved := path.resolve()) in shards:
                continue
            if (fmt := format_of(path)) is None:  # _expand only returns unknown formats for a file named on its own
                raise ConfigError(f"{what} {spec}: unknown format (use one of {KNOWN})")
            shards[resolved] = Shard(resolved, fmt)
    if any(s.format == "parquet" for s in shards.values()):
        require_pyarrow("reading Parquet")
    return list(shards.values())


def _listed(paths: Iterable[Path]) -> list[Path]:
    """The data files among ``paths``: plain files of a known format, not hidden, not ``_SUCCESS``-style markers."""
    return sorted(p for p in paths if p.is_file() and not p.name.startswith((".", "_")) and format_of(p) is not None)


def _expand(spec: str, what: str) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    folder = path.is_dir()
    if folder or glob.has_magic(spec):
        files = _listed(path.iterdir() if folder else (Path(p) for p in glob.glob(os.path.expanduser(spec))))
        if not files:
            raise ConfigError(
                f"{what} {spec}: " + (f"the folder holds no {KNOWN} files" if folder else f"no {KNOWN} files match")
            )
        return files
    raise ConfigError(f"{what} {spec} does not exist")


# ---------------------------------------------------------------------------------------------- reading
def read_rows(
    shard: Shard, start: int = 0, columns: list[str] | None = None, max_row_bytes: int = MAX_ROW_BYTES
) -> Iterator[RawRow]:
    """Rows ``start``, ``start + 1``, ... (0-based) of ``shard`` to its end; ``columns``: the fields the caller needs
    (Parquet reads only those); a row over ``max_row_bytes`` is a bad row, the rest of it never read."""
    if shard.format == "jsonl":
        return _jsonl_rows(shard.path, start, max_row_bytes)
    if shard.format == "csv":
        return _csv_rows(shard.path, start, max_row_bytes)
    return _parquet_rows(shard.path, start, columns, max_row_bytes)


def count_rows(shard: Shard, max_row_bytes: int = MAX_ROW_BYTES) -> int:
    """How many rows :func:`read_rows` yields for ``shard`` (bad rows included), reading as little as it can."""
    if shard.format == "parquet":
        try:
            return int(_parquet_file(shard.path).metadata.num_rows)
        except Exception:  # an unreadable file is one bad row, as read_rows yields it
            return 1
    if shard.format == "jsonl":
        return sum(1 for _ in _jsonl_rows(shard.path, 0, max_row_bytes, parse=False))
    return sum(1 for _ in _csv_rows(shard.path, 0, max_row_bytes))


def _open_binary(path: Path) -> gzip.GzipFile | io.BufferedReader:
    raw = open(path, "rb")
    return gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw


def _clip(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + f"... ({len(text):,} characters)"


def _stream_error(path: Path, exc: BaseException) -> str:
    kind = "truncated or damaged gzip stream" if path.name.endswith(".gz") else "read error"
    return f"{kind}: {exc}"


def _too_long(size: int, limit: int) -> str:
    return f"row of {size:,} bytes, over the limit of {limit:,} (--max-row-bytes)"


def _bounded_lines(fh: io.BufferedIOBase, limit: int) -> Iterator[tuple[bytes, int]]:
    """``(line, size)`` for each physical line; one over ``limit`` bytes is its first ``limit + 1`` bytes and its whole
    size, the rest read in small chunks and dropped."""
    while line := fh.readline(limit + 1):
        size = len(line)
        if size > limit and not line.endswith(b"\n"):
            while chunk := fh.readline(_SKIP_CHUNK):
                size += len(chunk)
                if chunk.endswith(b"\n"):
                    break
        yield line, size


def _jsonl_rows(path: Path, start: int, limit: int, parse: bool = True) -> Iterator[RawRow]:
    row = line_no = 0
    try:
        with _open_binary(path) as fh:
            # line_no is read after the loop on a stream error
            for line_no, (line, size) in enumerate(_bounded_lines(fh, limit), 1):
                if line_no == 1 and line.startswith(_BOM):
                    line = line[len(_BOM) :]
                if not line.strip():
                    continue
                row += 1
                if row <= start:
                    continue
                if not parse:
                    yield RawRow(line_no, None)
                elif size > limit:
                    head = _clip(line[:RAW_LIMIT].decode("utf-8", "replace"))
                    yield RawRow(line_no, None, _too_long(size, limit), head)
                else:
                    yield _jsonl_row(line_no, line)
    except _STREAM_ERRORS as exc:
        row += 1
        if row > start:
            yield RawRow(line_no + 1, None, _stream_error(path, exc))


def _jsonl_row(line_no: int, line: bytes) -> RawRow:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 ({exc.reason} at byte {exc.start})"
        return RawRow(line_no, None, why, _clip(line.decode("utf-8", "replace")))
    try:
        value = json.loads(text)
    except ValueError as exc:
        return RawRow(line_no, None, f"not JSON ({exc})", _clip(text))
    except RecursionError:
        return RawRow(line_no, None, "not JSON (nested too deep)", _clip(text))
    if not isinstance(value, dict):
        return RawRow(line_no, None, f"not a JSON object (a {type(value).__name__})", _clip(text))
    return RawRow(line_no, value, raw=text)


class _RecordTooLong(Exception):
    """Raised through ``csv.reader`` by :class:`_LineRecorder` when a record grows past the limit."""


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


class _LineRecorder:
    """The physical lines a ``csv.reader`` consumes, at most ``limit`` bytes a record: kept for the record's raw text,
    counted (line numbers), and their quotes counted (where a quoted field ends)."""

    def __init__(self, text: io.TextIOBase, limit: int):
        self._text, self._limit = text, limit
        self.taken: list[str] = []
        self.size = 0  # bytes of the record so far
        self.quotes = 0  # quote characters in the record so far: odd inside a quoted field
        self.lines = 0  # physical lines read
        self.kept = 0  # characters in taken

    def __iter__(self) -> _LineRecorder:
        return self

    def __next__(self) -> str:
        line = self._text.readline(self._limit + 1)
        if not line:
            raise StopIteration
        self.size += len(line) if len(line) > self._limit else _text_bytes(line)
        self.quotes += line.count('"')
        if self.size > self._limit:
            self.taken.append(line[:RAW_LIMIT])
            self._finish_line(line)
            raise _RecordTooLong
        self.lines += 1
        if self.kept <= RAW_LIMIT:  # the raw text shown of a record is its start: its tail is not kept
            self.taken.append(line)
            self.kept += len(line)
        return line

    def _finish_line(self, line: str) -> None:
        """Read past the end of a line cut at the limit, counting what is dropped."""
        while not line.endswith(("\n", "\r")):
            line = self._text.readline(_SKIP_CHUNK)
            if not line:
                break
            self.size += _text_bytes(line)
            self.quotes += line.count('"')
        self.lines += 1

    def skip_quoted(self) -> None:
        """After a record that failed inside a quoted field: drop lines until the field ends (else read as rows)."""
        while self.quotes % 2:
            line = self._text.readline(_SKIP_CHUNK)
            if not line:
                return
            self.quotes += line.count('"')
            self.size += _text_bytes(line)
            self._finish_line(line)

    def pop(self) -> str:
        text = "".join(self.taken)
        self.taken.clear()
        self.size = self.quotes = self.kept = 0
        return text


def _csv_rows(path: Path, start: int, limit: int) -> Iterator[RawRow]:
    row, line_no = 0, 1
    try:
        with _open_binary(path) as binary:
            # surrogateescape: bytes that are not UTF-8 survive decoding, and only the rows holding them are rejected
            text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="surrogateescape", newline="")
            recorder = _LineRecorder(text, limit)
            # a field may be as long as its record (csv's limit is process-wide: only ever raised)
            if csv.field_size_limit() < limit:
                csv.field_size_limit(limit)
            reader = csv.reader(recorder)
            header: list[str] | None = None
            while True:
                line_no = recorder.lines + 1
                try:
                    record = next(reader)
                except StopIteration:
                    break
                except (csv.Error, _RecordTooLong) as exc:
                    recorder.skip_quoted()
                    size, raw = recorder.size, recorder.pop()
                    if header is None:
                        header = []  # every row is rejected: no field names
                        continue
                    row += 1
                    if row > start:
                        why = _too_long(size, limit) if isinstance(exc, _RecordTooLong) else f"not valid CSV ({exc})"
                        yield RawRow(line_no, None, why, _clip(_readable(raw)))
                    continue
                raw = recorder.pop()
                if not record:  # a blank line
                    continue
                if header is None:
                    header = [name.strip() for name in record]
                    continue
                row += 1
                if row <= start:
                    continue
                yield _csv_row(line_no, record, header, raw)
    except _STREAM_ERRORS as exc:
        row += 1
        if row > start:
            yield RawRow(line_no, None, _stream_error(path, exc))


def _readable(raw: str) -> str:
    """Raw CSV text with any non-UTF-8 bytes shown as U+FFFD."""
    return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _csv_row(line_no: int, record: list[str], header: list[str], raw: str) -> RawRow:
    if any(_SURROGATE.search(field) for field in record if not field.isascii()):
        return RawRow(line_no, None, "not UTF-8", _clip(_readable(raw)))
    if len(record) != len(header):
        return RawRow(line_no, None, f"expected {len(header)} fields (the header's), found {len(record)}", _clip(raw))
    return RawRow(line_no, dict(zip(header, record)), raw=raw)


def _parquet_file(path: Path) -> Any:  # a pyarrow.parquet.ParquetFile (pyarrow ships no types)
    import pyarrow.parquet as pq

    return pq.ParquetFile(path)


def _parquet_rows(path: Path, start: int, columns: list[str] | None, limit: int) -> Iterator[RawRow]:
    try:
        parquet = _parquet_file(path)
    except Exception as exc:
        if start == 0:
            yield RawRow(1, None, f"not a readable Parquet file ({exc})")
        return
    names = set(parquet.schema_arrow.names)
    wanted = [c for c in dict.fromkeys(columns) if c in names] if columns is not None else None
    first = 0  # the file's row number of the group's first row (0-based)
    for group in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(group).num_rows
        if first + size > start:
            skip = max(0, start - first)
            if (why := _oversized_group(parquet, group, wanted, limit)) is not None:
                yield from (RawRow(first + j + 1, None, why) for j in range(skip, size))
            else:
                yield from _parquet_group(parquet, group, first, size, skip, wanted, limit)
        first += size


def _oversized_group(parquet: Any, group: int, columns: list[str] | None, limit: int) -> str | None:
    """Why a row group is not decoded (its columns read, uncompressed, over the limits), else None: from the footer."""
    meta = parquet.metadata.row_group(group)
    read = set(columns) if columns is not None else None
    chunks = [meta.column(i) for i in range(meta.num_columns)]
    total = sum(c.total_uncompressed_size for c in chunks if read is None or c.path_in_schema.split(".")[0] in read)
    if total > PARQUET_GROUP_BYTES or total > limit * max(meta.num_rows, 1):
        return (
            f"Parquet row group {group} not read: its columns take {total:,} bytes uncompressed "
            f"for {meta.num_rows:,} rows, "
            f"over {limit:,} a row (--max-row-bytes) or {PARQUET_GROUP_BYTES:,} a row group"
        )
    return None


def _fields_bytes(fields: dict[str, Any]) -> int:
    return sum(_text_bytes(v) if isinstance(v, str) else len(v) if isinstance(v, bytes) else 8 for v in fields.values())


def _batch_rows(batch: Any, first_line: int, limit: int) -> list[RawRow]:
    """A decoded batch as rows; a value that cannot be decoded (not UTF-8) or a row over the limit fails alone."""
    try:
        decoded = batch.to_pylist() if batch.num_columns else [{} for _ in range(batch.num_rows)]
    except Exception:
        decoded = None
    rows = []
    for j in range(batch.num_rows):
        line = first_line + j
        try:
            fields = decoded[j] if decoded is not None else batch.slice(j, 1).to_pylist()[0]
        except Exception as exc:
            rows.append(RawRow(line, None, f"unreadable Parquet row ({type(exc).__name__}: {exc})"))
            continue
        size = _fields_bytes(fields)
        rows.append(RawRow(line, None, _too_long(size, limit)) if size > limit else RawRow(line, fields))
    return rows


def _parquet_group(
    parquet: Any, group: int, first: int, size: int, skip: int, columns: list[str] | None, limit: int
) -> Iterator[RawRow]:
    """Rows ``skip`` .. ``size - 1`` of a row group, in bounded batches; the rest of a group that fails are bad rows."""
    i = 0
    why = f"row missing from Parquet row group {group}"  # fewer rows than its metadata says
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group], columns=columns):
            if i + batch.num_rows > skip:
                yield from _batch_rows(batch, first + i + 1, limit)[max(0, skip - i) :]
            i += batch.num_rows
    except Exception as exc:
        why = f"unreadable Parquet row group {group} ({exc})"
    yield from (RawRow(first + j + 1, None, why) for j in range(max(i, skip), size))


def raw_text(row: RawRow) -> str:
    """What the rejects file shows of a row: the text read, or the row's fields as JSON (Parquet)."""
    if row.raw:
        return _clip(row.raw)
    if row.fields is not None:
        with contextlib.suppress(TypeError, ValueError, RecursionError):  # a value nested too deep to write
            return _clip(json.dumps(row.fields, ensure_ascii=False, default=str))
    return ""

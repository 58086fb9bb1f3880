"""The files a batch job publishes: the results (JSONL, CSV or Parquet, by the output's suffix) and the rejects (JSONL).

Results, one row per labelled input row, in input order:

- JSONL: ``{"id": ..., "label": "Sports", "confidence": 0.93}``, with ``--min-confidence`` also ``"confident"``,
  with ``--probabilities`` also ``"probabilities": {"World": ..., ...}`` (the shape of the HTTP API's answers);
- CSV: a header ``id,label,confidence`` (then ``confident``, then ``prob_World,prob_Sports,...``);
- Parquet: CSV's columns; ``id`` int64 for row numbers, a string for ``--id-field`` values; row groups of
  ``PARQUET_ROWS`` rows, so memory stays bounded.

A multi-label model's rows carry every label over its threshold, highest first: ``labels`` and ``scores`` (lists in
JSONL and Parquet, comma-separated cells in CSV) instead of ``label`` and ``confidence``. Rejects, one per rejected
row: ``{"file", "line", "row", "reason", "raw"}``. Writers write a temporary file that ``close()`` fsyncs and the
caller renames into place: a reader never sees half a file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

from ...checkpoint.atomic import open_new
from ..confidence import ConfidenceThreshold

PARQUET_ROWS = 65_536


class ResultWriter:
    """``write(id, label_id, probabilities)`` per row, ``close()`` once. With ``min_confidence``, each row also
    says whether its label's probability met the label's threshold. ``string_ids``: the ids are ``--id-field``
    values, not row numbers (a typed format's id column is a string)."""

    gzips = True  # a .gz output is gzipped whole

    def __init__(
        self,
        path: Path,
        labels: Sequence[str],
        probabilities: bool,
        compressed: bool = False,
        min_confidence: ConfidenceThreshold | None = None,
        multi_label: bool = False,
        string_ids: bool = False,
    ):
        self.labels = list(labels)
        self.probabilities, self.min_confidence, self.multi_label = probabilities, min_confidence, multi_label
        self.string_ids = string_ids
        self._raw = cast(io.BufferedWriter, open_new(path, "wb"))  # what fdopen gives for "wb"
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if compressed and self.gzips else None
        self._opened()

    def _opened(self) -> None:
        """The format's own start, once the file is open (a text layer, a header row)."""

    def _binary(self) -> gzip.GzipFile | io.BufferedWriter:
        return self._gzip or self._raw

    def write(self, row_id: Any, label_id: int | list[int], probs: Sequence[float]) -> None:
        """``label_id``: the label, or a multi-label model's labels over their thresholds (a list of ids)."""
        raise NotImplementedError

    def answer(self, label_id: int | list[int], probs: Sequence[float]) -> list[Any]:
        """The row's columns after its id: label, confidence (and whether confident), or multi-label labels, scores."""
        if isinstance(label_id, list):
            return [[self.labels[i] for i in label_id], [float(probs[i]) for i in label_id]]
        label, confidence = self.labels[label_id], float(probs[label_id])
        return [label, confidence] + (
            [] if self.min_confidence is None else [self.min_confidence.confident(label, confidence)]
        )

    def close(self) -> None:
        if (text := getattr(self, "_text", None)) is not None:  # JSONL's and CSV's, over the binary file
            text.flush()
            text.detach()
        if self._gzip is not None:
            self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()


class JsonlResults(ResultWriter):
    def _opened(self) -> None:
        self._text = io.TextIOWrapper(self._binary(), encoding="utf-8", newline="\n", write_through=False)

    def write(self, row_id: Any, label_id: int | list[int], probs: Sequence[float]) -> None:
        names = columns(self.labels, False, self.min_confidence is not None, self.multi_label)[1:]
        record: dict[str, Any] = {"id": row_id, **dict(zip(names, self.answer(label_id, probs)))}
        if self.probabilities:
            record["probabilities"] = dict(zip(self.labels, probs))
        self._text.write(json.dumps(record, ensure_ascii=False) + "\n")


class CsvResults(ResultWriter):
    def _opened(self) -> None:
        self._text = io.TextIOWrapper(self._binary(), encoding="utf-8", newline="", write_through=False)
        self._csv = csv.writer(self._text, lineterminator="\n")
        self._csv.writerow(columns(self.labels, self.probabilities, self.min_confidence is not None, self.multi_label))

    def write(self, row_id: Any, label_id: int | list[int], probs: Sequence[float]) -> None:
        row = [row_id, *(_cell(value) for value in self.answer(label_id, probs))]
        if self.probabilities:
            row += [repr(float(p)) for p in probs]
        self._csv.writerow(row)


class ParquetResults(ResultWriter):
    gzips = False  # Parquet compresses its own pages: never gzip around it

    def _opened(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        confident = self.min_confidence is not None
        names = columns(self.labels, self.probabilities, confident, self.multi_label)
        flags = [pa.bool_()] if confident else []
        answer = [pa.list_(pa.string()), pa.list_(pa.float64())] if self.multi_label else [pa.string(), pa.float64()]
        types = [pa.string() if self.string_ids else pa.int64(), *answer, *flags]
        types += [pa.float64()] * (len(names) - len(types))
        self._schema = pa.schema(list(zip(names, types)))
        self._columns: list[list[Any]] = [[] for _ in names]
        self._writer = pq.ParquetWriter(self._binary(), self._schema)

    def write(self, row_id: Any, label_id: int | list[int], probs: Sequence[float]) -> None:
        values = [str(row_id) if self.string_ids else row_id, *self.answer(label_id, probs)]
        if self.probabilities:
            values += [float(p) for p in probs]
        for column, value in zip(self._columns, values):
            column.append(value)
        if len(self._columns[0]) >= PARQUET_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._columns[0]:
            self._writer.write_table(self._pa.Table.from_arrays(self._columns, schema=self._schema))
            self._columns = [[] for _ in self._columns]

    def close(self) -> None:
        self._flush()
        self._writer.close()
        super().close()


def columns(
    labels: Sequence[str], probabilities: bool, confident: bool = False, multi_label: bool = False
) -> list[str]:
    answer = ["labels", "scores"] if multi_label else ["label", "confidence", *(["confident"] if confident else [])]
    return ["id", *answer] + ([f"prob_{label}" for label in labels] if probabilities else [])


def _cell(value: Any) -> str:
    """A CSV cell: a float as repr writes it, a bool as true/false, a list comma-separated."""
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


WRITERS: dict[str, type[ResultWriter]] = {"jsonl": JsonlResults, "csv": CsvResults, "parquet": ParquetResults}


class RejectsWriter:
    """``OUTPUT.rejects.jsonl``: one JSON object per rejected row; the file is made at the first one."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: IO[str] | None = None

    def write(self, reject: dict[str, Any]) -> None:
        if self._fh is None:
            self._fh = open_new(self.path, "w", encoding="utf-8", newline="\n")
        self._fh.write(json.dumps(reject, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

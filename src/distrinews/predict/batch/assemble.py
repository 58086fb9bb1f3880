"""The end of a batch job: every worker's committed rows, in input order, into the output and rejects files, published
whole.

A worker's ``rows.jsonl`` holds each row of its range once, a window's rows in length order; a window is at most
``worker.WINDOW_BATCHES`` batches, so a heap of that size restores input order, and workers' ranges are consecutive.
Both files are written in the progress folder, fsynced, then renamed into place, the output last (its appearance
means the job is complete), and the progress folder is removed: a kill leaves no output or the complete one.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...checkpoint.atomic import open_nofollow, remove_entry
from ..confidence import ConfidenceThreshold
from ..predictor import checkpoint_multi_label
from .job import CheckedJob
from .outputs import WRITERS, RejectsWriter
from .state import JobRecord, StateError, WorkerManifest, fsync_dir


@dataclass
class Totals:
    rows: int = 0
    labelled: int = 0
    rejected: int = 0


def in_input_order(path: os.PathLike[str], committed: int, start: int, end: int) -> Iterator[dict[str, Any]]:
    """The committed lines of one worker's ``rows.jsonl``, each row ``start`` .. ``end - 1`` once, in row order."""
    heap: list[tuple[int, int, dict[str, Any]]] = []
    expected, read = start, 0
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as fh:
        for seq, line in enumerate(fh):
            read += len(line)
            if read > committed:
                break
            record = json.loads(line)
            row = record["r"]
            if not expected <= row < end:
                raise StateError(f"{path}: row {row} twice, or outside the worker's rows {start}-{end}")
            heapq.heappush(heap, (row, seq, record))
            while heap and heap[0][0] == expected:
                yield heapq.heappop(heap)[2]
                expected += 1
                if heap and heap[0][0] < expected:
                    raise StateError(f"{path}: row {heap[0][0]} twice")
    if expected != end:
        raise StateError(f"{path}: rows {expected}-{end} are missing")


def assemble(checked: CheckedJob, job: JobRecord, manifests: list[WorkerManifest]) -> Totals:
    """Write the output and rejects files from the workers' rows and publish them; returns what they hold."""
    labels = next((m.labels for m in manifests if m.labels), None) or []
    files = OutputFiles(checked, labels, string_ids=job.id_field is not None)
    try:
        for k, m in enumerate(manifests):
            if m.end > m.start:
                for record in in_input_order(checked.state.rows_path(k), m.committed_bytes, m.start, m.end):
                    files.add(record)
    finally:
        files.close()
    files.publish(job.total_rows)
    return files.totals


class OutputFiles:
    """The output and rejects files of a job, written in the progress folder from records in input order, then
    published. A record (a line of a worker's ``rows.jsonl``, or the Ray engine's): ``{"r": row, "l": label id (a
    multi-label model's: a list), "p": probabilities[, "id": id]}``, or ``{"r": row, "x": reject}``."""

    def __init__(self, checked: CheckedJob, labels: list[str], string_ids: bool):
        self.checked = checked
        self.out_tmp, self.rejects_tmp = checked.state.path / "output.tmp", checked.state.path / "rejects.tmp"
        for tmp in (self.out_tmp, self.rejects_tmp):
            remove_entry(tmp)
        threshold = ConfidenceThreshold.parse(checked.job.min_confidence)
        # a multi-label model's workers applied --min-confidence as its thresholds already
        multi_label = checkpoint_multi_label(checked.job.checkpoint)
        self.results = WRITERS[checked.output_format](
            self.out_tmp,
            labels,
            checked.job.probabilities,
            compressed=checked.output_compressed,
            string_ids=string_ids,
            min_confidence=None if threshold is None or multi_label else threshold.for_labels(labels),
            multi_label=multi_label,
        )
        self.rejects = RejectsWriter(self.rejects_tmp)
        self.totals = Totals()
        self._closed = False

    def add(self, record: dict[str, Any]) -> None:
        self.totals.rows += 1
        if "x" in record:
            self.rejects.write(record["x"])
            self.totals.rejected += 1
        else:
            self.results.write(record["id"] if "id" in record else record["r"], record["l"], record["p"])
            self.totals.labelled += 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.results.close()
            finally:
                self.rejects.close()

    def publish(self, total_rows: int) -> None:
        """Both files into place, once they hold every one of the job's ``total_rows`` rows: the rejects first, the
        output last (its appearance says the job is done); then the progress folder goes."""
        self.close()
        if self.totals.rows != total_rows:
            raise StateError(f"assembled {self.totals.rows} rows of {total_rows}")
        checked = self.checked
        if self.totals.rejected:
            os.replace(self.rejects_tmp, checked.rejects)
        else:  # one from an earlier run over this output would describe other rows
            checked.rejects.unlink(missing_ok=True)
        os.replace(self.out_tmp, checked.output)
        fsync_dir(checked.output.parent)
        shutil.rmtree(checked.state.path, ignore_errors=True)

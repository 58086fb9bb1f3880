"""The end of a batch job: every worker's committed rows, in input order, into the output and rejects files, published whole.

Worker K's ``rows.jsonl`` holds the rows of its range ``[start, end)``, each exactly once, in commit
order: a window's rows are committed in length order, and a window is at most
``worker.WINDOW_BATCHES`` batches of rows, so a heap of that size puts them back in input order.
Workers' ranges are consecutive, so the output is worker 0's rows, then worker 1's, ...: the input order.

Both files are written in the progress folder, fsynced, then renamed into place: the rejects first,
the output last (its appearance means the job is complete), and the progress folder is removed.
A kill at any point leaves either no output (the next run assembles again) or the complete one.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .job import CheckedJob
from .outputs import RejectsWriter, open_results
from .state import JobRecord, StateError, WorkerManifest, fsync_dir


@dataclass
class Totals:
    rows: int = 0
    labelled: int = 0
    rejected: int = 0


def in_input_order(path: os.PathLike, committed: int, start: int, end: int) -> Iterator[dict[str, Any]]:
    """The committed lines of one worker's ``rows.jsonl``, each row ``start`` .. ``end - 1`` once, in row order."""
    heap: list[tuple[int, int, dict[str, Any]]] = []
    expected = start
    read = 0
    with open(path, "rb") as fh:
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
    state = checked.state
    labels = next((m.labels for m in manifests if m.labels), None) or []
    out_tmp, rejects_tmp = state.path / "output.tmp", state.path / "rejects.tmp"
    for tmp in (out_tmp, rejects_tmp):
        tmp.unlink(missing_ok=True)
    results = open_results(
        out_tmp,
        checked.output_format,
        labels,
        checked.job.probabilities,
        compressed=checked.output_compressed,
        string_ids=job.id_field is not None,
    )
    rejects = RejectsWriter(rejects_tmp)
    totals = Totals()
    try:
        for k, manifest in enumerate(manifests):
            if manifest.end == manifest.start:
                continue
            for record in in_input_order(state.rows_path(k), manifest.committed_bytes, manifest.start, manifest.end):
                totals.rows += 1
                if "x" in record:
                    rejects.write(record["x"])
                    totals.rejected += 1
                else:
                    results.write(record["id"] if "id" in record else record["r"], record["l"], record["p"])
                    totals.labelled += 1
    finally:
        results.close()
        rejects.close()
    if totals.rows != job.total_rows:
        raise StateError(f"assembled {totals.rows} rows of {job.total_rows}")
    publish(checked, rejects_tmp if rejects.rows else None, out_tmp)
    return totals


def publish(checked: CheckedJob, rejects_tmp: os.PathLike | None, out_tmp: os.PathLike) -> None:
    """Rejects first, output last (the output's appearance says the job is done); then the progress folder goes."""
    if rejects_tmp is not None:
        os.replace(rejects_tmp, checked.rejects)
    else:
        checked.rejects.unlink(missing_ok=True)  # one from an earlier run over this output would describe other rows
    os.replace(out_tmp, checked.output)
    fsync_dir(checked.output.parent)
    shutil.rmtree(checked.state.path, ignore_errors=True)

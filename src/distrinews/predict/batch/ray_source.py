"""The Ray engine's reading (``ray_engine``): a Ray Data ``Datasource`` over our own reader, one Ray row per window.

Why our reader and not ``ray.data.read_json``/``read_csv``/``read_parquet``, and why a row per window:
see ``ray_engine``. Imports Ray: only the Ray engine imports this module, after ``require_ray``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from ray.data import Datasource
from ray.data.block import BlockMetadata
from ray.data.datasource import ReadTask

from ...data.fields import RowFields
from .state import JobRecord
from .worker import job_rows, read_window

if TYPE_CHECKING:
    import pyarrow as pa  # imported where it is used: Parquet and Ray are extras


def _window_schema() -> pa.Schema:
    import pyarrow as pa

    strings = pa.list_(pa.string())
    return pa.schema(
        [
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("rows", pa.list_(pa.int64())),  # the usable rows' numbers in the whole input
            ("ids", strings),  # their ids as JSON (a number or a string, whatever --id-field holds)
            ("texts", strings),
            ("rejects", strings),  # the rejected rows' records for the output files, as JSON
        ]
    )


def read_windows(record: JobRecord, fields: RowFields, window_rows: int, lo: int, hi: int) -> Iterator[Any]:
    """Rows ``lo`` .. ``hi - 1`` (``lo`` on a window boundary) as one-row Arrow tables, one per window."""
    import pyarrow as pa

    schema = _window_schema()
    rows = job_rows(record, fields.columns(), lo, hi)
    for start in range(lo, hi, window_rows):
        end = min(start + window_rows, hi)
        rejects, keys, texts = read_window(fields, rows, end - start)
        columns = {
            "start": start,
            "end": end,
            "rows": [row for row, _ in keys],
            "ids": [json.dumps(row_id, ensure_ascii=False) for _, row_id in keys],
            "texts": texts,
            "rejects": [json.dumps({"r": row, "x": reject}, ensure_ascii=False) for row, reject in rejects],
        }
        yield pa.Table.from_pydict({name: [value] for name, value in columns.items()}, schema=schema)


class CorpusDatasource(Datasource):
    """A Ray ``Datasource`` over ``data.files``: ``tasks`` read tasks, each a contiguous range of whole windows."""

    def __init__(self, record: JobRecord, fields: RowFields, window_rows: int, tasks: int):
        super().__init__()  # type: ignore[no-untyped-call]  # ray's Datasource.__init__ is unannotated
        self.record, self.fields, self.window_rows, self.tasks = record, fields, window_rows, tasks

    def get_name(self) -> str:
        return "DistriNewsCorpus"

    def estimate_inmemory_data_size(self) -> int:
        return sum(s.size for s in self.record.inputs)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        total, size = self.record.total_rows, self.window_rows
        windows = -(-total // size)
        tasks = max(1, min(self.tasks, windows)) if windows else 0
        bytes_per_row = self.estimate_inmemory_data_size() / max(total, 1)
        out = []
        for k in range(tasks):
            lo, hi = min(total, windows * k // tasks * size), min(total, windows * (k + 1) // tasks * size)
            if hi <= lo:
                continue
            files = tuple(
                s.path
                for s, first in zip(self.record.inputs, self.record.offsets())
                if first < hi and first + s.rows > lo
            )
            windows_here = -(-(hi - lo) // size)
            metadata = BlockMetadata(
                num_rows=windows_here, size_bytes=int(bytes_per_row * (hi - lo)), input_files=files, exec_stats=None
            )
            read = partial(read_windows, self.record, self.fields, size, lo, hi)
            out.append(ReadTask(read, metadata, schema=_window_schema()))
        return out

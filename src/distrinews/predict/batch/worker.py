"""One worker of a batch job: its row range, read, tokenized, batched, computed and committed, in a pipeline.

A reader thread takes the rows a *window* at a time (``WINDOW_BATCHES`` x ``--batch-size`` rows, in input order),
sets bad rows apart, tokenizes the rest (the Rust tokenizer releases the GIL) and cuts them into forward passes as
the server does (``batch_forming.plan_passes``: sorted by length, at most ``--batch-size`` texts and
``--max-batch-tokens`` padded tokens). At most ``PREFETCH`` windows wait, so memory does not grow with the corpus.

The commit, after a window's rejected rows and after every pass: (1) append the rows' lines to
``worker-K/rows.jsonl``, flush, fsync; (2) write ``worker-K/manifest.json`` whole: the rows done and the length of
``rows.jsonl`` that holds them. A kill between 1 and 2 leaves lines past ``committed_bytes``, truncated at the next
start: at most one pass per worker is computed twice. The manifest records the window being worked on and its done
rows; a restart plans the rest of it again, and since passes are cut from the length-sorted window in order, they
are the same passes (the same texts padded together, the same numbers).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ... import tracing
from ...checkpoint.atomic import make_dir
from ...checkpoint.file_lock import FileLock
from ...data.fields import TEXT_CHARS, BadRow, RowFields
from ...data.files import RawRow, Shard, raw_text, read_rows
from ...distributed.lifetime import die_with_parent
from ...errors import CheckpointError, ConfigError, DataError
from ..batch_forming import plan_passes
from .state import LOCK_FILE, JobRecord, StateDir, StateError, WorkerManifest

WINDOW_BATCHES = 8  # a window is this many batches' worth of rows: the span within which texts are sorted by length
PREFETCH = 2  # windows read and tokenized ahead of the model
LOCK_WAIT_S = 10.0  # for a worker of a killed run to be gone (it dies with its parent: PR_SET_PDEATHSIG)
USAGE_ERRORS = (ConfigError, DataError, CheckpointError, FileNotFoundError)

Report = Callable[[int, int, int], None]  # rows done, of which labelled, of which rejected


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker computes: none of it changes the results, so it may differ between a run and its restart."""

    threads: int
    batch_size: int
    max_batch_tokens: int | None  # None: no limit

    @property
    def window_rows(self) -> int:
        return WINDOW_BATCHES * self.batch_size


def load_predictor(checkpoint: str, runtime: str, threads: int, batch_size: int) -> Any:
    """The runtime's predictor, using ``threads`` cores (torch's intra-op threads, or ONNX Runtime's)."""
    from ..runtimes import make_predictor

    try:
        if not runtime.startswith("onnx"):
            import torch

            torch.set_num_threads(threads)
        # auto: the int8 model beside the checkpoint where it passed its check (made at the first start; with
        # --nproc N by the parent, before the workers start: engine._prepare_auto).
        return make_predictor(checkpoint, runtime, max_batch_size=batch_size, threads=threads)
    except USAGE_ERRORS:
        raise
    except ValueError as exc:  # make_predictor's refusals (a runtime this machine or checkpoint cannot run)
        raise ConfigError(f"predict: {exc}") from None


@dataclass
class _Window:
    start: int
    end: int
    rejects: list[tuple[int, dict[str, Any]]]  # (row, what the rejects file says)
    batches: list[list[tuple[int, Any, Any]]]  # passes of (row, id, encoded text)


def job_rows(job: JobRecord, columns: list[str], lo: int, hi: int) -> Iterator[tuple[int, Path, RawRow]]:
    """Rows ``lo`` .. ``hi - 1`` of the job's input (global row numbers, input order), each with its file."""
    for record, offset in zip(job.inputs, job.offsets()):
        stop = min(offset + record.rows, hi)
        if stop <= lo or offset >= hi:
            continue
        path = Path(record.path)
        row = max(offset, lo)
        shard = Shard(path, record.format)
        for raw in read_rows(shard, start=row - offset, columns=columns, max_row_bytes=job.max_row_bytes):
            if row >= stop:
                break
            yield row, path, raw
            row += 1
        while row < stop:  # the file has fewer rows than when the job started
            yield row, path, RawRow(0, None, "row missing when the file was read again (did it change during the job?)")
            row += 1


def read_window(
    fields: RowFields, rows: Iterator[tuple[int, Path, RawRow]], count: int, skip: Container[int] = ()
) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, Any]], list[str]]:
    """The next ``count`` of ``rows`` (those in ``skip`` left out): the rejected ones as ``(row, what the rejects
    file says of it)``, and the usable ones' ``(row, id)`` and texts."""
    rejects: list[tuple[int, dict[str, Any]]] = []
    keys: list[tuple[int, Any]] = []
    texts: list[str] = []
    for row, path, raw in islice(rows, count):
        if row in skip:
            continue
        reason = raw.error
        if reason is None:
            assert raw.fields is not None, "a row read without an error has its fields"
            try:
                text, row_id = fields.text(raw.fields)[:TEXT_CHARS], fields.id(raw.fields, row)
            except BadRow as exc:
                reason = str(exc)
            else:
                keys.append((row, row_id))
                texts.append(text)
                continue
        reject = {"file": str(path), "line": raw.line, "row": row, "reason": reason, "raw": raw_text(raw)}
        rejects.append((row, {key: _shown(v) if isinstance(v, str) else v for key, v in reject.items()}))
    return rejects, keys, texts


def passes(
    keys: list[tuple[int, Any]],
    texts: list[str],
    encode: Callable[[list[str]], Sequence[Any]],
    settings: WorkerSettings,
) -> list[list[tuple[int, Any, Any]]]:
    """A window's forward passes, cut as the server cuts them (``plan_passes``): ``(row, id, encoded text)`` each."""
    if not texts:
        return []
    encoded = encode(texts)
    cut = plan_passes([len(e) for e in encoded], settings.batch_size, settings.max_batch_tokens)
    return [[(*keys[i], encoded[i]) for i in indices] for indices in cut]


def _shown(text: str) -> str:
    """``text`` as UTF-8 can hold it: a lone surrogate (a file name not in UTF-8) as its escape, ``\\udcff``."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _windows(
    job: JobRecord,
    manifest: WorkerManifest,
    fields: RowFields,
    encode: Callable[[list[str]], Sequence[Any]],
    settings: WorkerSettings,
) -> Iterator[_Window]:
    size = settings.window_rows
    if manifest.window is not None:  # resuming inside a window: its done rows are left out
        start, end = manifest.window
        skip = set(manifest.window_done)
    else:
        start, end, skip = manifest.done_through, min(manifest.done_through + size, manifest.end), set()
    rows = job_rows(job, fields.columns(), start, manifest.end)
    while start < manifest.end:
        rejects, keys, texts = read_window(fields, rows, end - start, skip)
        yield _Window(start, end, rejects, passes(keys, texts, encode, settings))
        start, end, skip = end, min(end + size, manifest.end), set()


class _Prefetch:
    """Runs an iterator on its own thread, at most ``depth`` items ahead; its exceptions surface in the consumer."""

    def __init__(self, items: Iterator[Any], depth: int = PREFETCH):
        self._queue: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)  # (more, item or what it raised)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), name="distrinews-predict-reader", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple[bool, Any]) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(entry, timeout=0.1)
                return True
        return False

    def _run(self, items: Iterator[Any]) -> None:
        try:
            if all(self._put((True, item)) for item in items):
                self._put((False, None))
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put((False, exc))

    def __iter__(self) -> Iterator[Any]:
        while (entry := self._queue.get())[0]:
            yield entry[1]
        if entry[1] is not None:
            raise entry[1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Committer:
    """Appends committed rows to ``rows.jsonl`` and records them in the manifest (the module's commit protocol)."""

    def __init__(self, state: StateDir, manifest: WorkerManifest, log: io.BufferedWriter, report: Report) -> None:
        self.state, self.manifest, self.log, self.report = state, manifest, log, report

    def begin(self, window: _Window) -> None:
        if self.manifest.window != (window.start, window.end):
            self.manifest.window = (window.start, window.end)
            self.manifest.window_done = []

    def commit(self, lines: list[str], rows: list[int], labelled: int = 0, rejected: int = 0) -> None:
        data = "".join(lines).encode("utf-8")
        self.log.write(data)
        self.log.flush()
        os.fsync(self.log.fileno())
        m = self.manifest
        m.committed_bytes += len(data)
        m.window_done.extend(rows)
        m.labelled += labelled
        m.rejected += rejected
        self._advance_if_done()
        self.state.write_manifest(m)
        self.report(len(rows), labelled, rejected)

    def end(self, window: _Window) -> None:
        """A window with nothing left to commit (all of it done before a restart) is closed here."""
        if self.manifest.window == (window.start, window.end):
            self.manifest.window_done = list(range(window.start, window.end))
            self._advance_if_done()
            self.state.write_manifest(self.manifest)

    def _advance_if_done(self) -> None:
        m = self.manifest
        if m.window is not None and len(m.window_done) >= m.window[1] - m.window[0]:
            m.done_through, m.window, m.window_done = m.window[1], None, []


def result_lines(predictor: Any, batch: list[tuple[int, Any, Any]], with_id: bool) -> list[str]:
    """One forward pass over ``batch``: its rows' records (the lines of ``rows.jsonl``)."""
    results = predictor.predict_encoded([encoded for _, _, encoded in batch])
    lines = []
    for (row, row_id, _), result in zip(batch, results, strict=True):
        # a multi-label answer's "l" is the list of its labels' ids (those over their thresholds, highest first)
        chosen = result["label_id"] if "label_id" in result else [x["label_id"] for x in result["labels"]]
        record: dict[str, Any] = {"r": row, "l": chosen, "p": list(result["probabilities"].values())}
        if with_id:
            record["id"] = row_id
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return lines


def run_worker(
    state: StateDir,
    job: JobRecord,
    k: int,
    settings: WorkerSettings,
    report: Report,
    ready: Callable[[], None] = lambda: None,
    predictor: Any = None,
) -> WorkerManifest:
    """Do worker ``k``'s remaining rows; returns its final manifest. ``ready()`` is called once the model is loaded;
    ``predictor``: one already loaded (else loaded here)."""
    make_dir(state.worker_dir(k))
    lock = FileLock(state.worker_dir(k) / LOCK_FILE)
    if not lock.acquire(wait_s=LOCK_WAIT_S):
        raise ConfigError(
            f"predict: {state.worker_dir(k)} is being written by process {lock.holder()}: another run on this output"
        )
    try:
        manifest = state.read_manifest(k) or WorkerManifest.fresh(k, *job.ranges[k])
        if manifest.complete:
            return manifest
        if predictor is None:
            predictor = load_predictor(job.checkpoint, job.runtime, settings.threads, settings.batch_size)
        ready()
        labels = list(predictor.labels)
        if manifest.labels not in (None, labels):
            raise StateError(f"{state.manifest_path(k)} has labels {manifest.labels}, the model {labels}")
        manifest.labels = labels
        rows_path = state.rows_path(k)
        with state.open_rows(k) as log:
            size = os.fstat(log.fileno()).st_size
            if size < manifest.committed_bytes:
                raise StateError(
                    f"{rows_path} holds {size} bytes, fewer than the {manifest.committed_bytes} its manifest committed"
                )
            log.truncate(manifest.committed_bytes)  # lines written after the last commit: their pass is computed again
            _work(state, job, manifest, settings, predictor, _Committer(state, manifest, log, report))
        return manifest
    finally:
        lock.release()


def _work(
    state: StateDir,
    job: JobRecord,
    manifest: WorkerManifest,
    settings: WorkerSettings,
    predictor: Any,
    committer: _Committer,
) -> None:
    windows = _Prefetch(_windows(job, manifest, RowFields(job.text_field, job.id_field), predictor.encode, settings))
    try:
        for window in windows:
            with tracing.span(
                "distrinews.predict.window",
                **{
                    "distrinews.worker": manifest.worker,
                    "distrinews.window.start": window.start,
                    "distrinews.window.end": window.end,
                    "distrinews.window.labelled": sum(len(batch) for batch in window.batches),
                    "distrinews.window.rejected": len(window.rejects),
                    "distrinews.window.passes": len(window.batches),
                },
            ):
                committer.begin(window)
                if window.rejects:
                    lines = [
                        json.dumps({"r": row, "x": reject}, ensure_ascii=False) + "\n" for row, reject in window.rejects
                    ]
                    committer.commit(lines, [row for row, _ in window.rejects], rejected=len(lines))
                for batch in window.batches:
                    lines = result_lines(predictor, batch, job.id_field is not None)
                    committer.commit(lines, [row for row, _, _ in batch], labelled=len(batch))
                committer.end(window)
    finally:
        windows.close()


# ---------------------------------------------------------------------------------------------- as a process
def spawned(state_path: str, k: int, settings: WorkerSettings, events: Connection, parent_pid: int) -> None:
    """Worker ``k`` in its own process: progress and errors go to the parent through ``events`` (a pipe's end)."""
    die_with_parent(parent_pid)
    state = StateDir(Path(state_path))
    # The parent's OTEL_EXPORTER_OTLP_ENDPOINT (or --otlp-endpoint, put there): this process's windows are traced too.
    with tracing.session("distrinews-predict"):
        try:
            job = state.read_job()
            assert job is not None, f"{state.job_path} is missing"
            run_worker(
                state,
                job,
                k,
                settings,
                report=lambda rows, labelled, rejected: events.send(("progress", k, rows, labelled, rejected)),
                ready=lambda: events.send(("ready", k)),
            )
        except USAGE_ERRORS as exc:
            events.send(("error", k, str(exc)))
            sys.exit(2)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                sys.exit(130)
            events.send(("crash", k, f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()
            sys.exit(1)

"""The local engine: a batch job on this machine, in one process or ``--nproc`` worker processes, resumable.

``run(job)``: ``job.check`` (every check that needs no model; nothing written); the progress folder
``OUTPUT.partial/``, locked (``shell``): continued when its input, checkpoint, runtime, fields and ``--nproc`` are
this run's, refused when they differ and rows are done, else started (rows counted, one contiguous range per
worker: ``job.json``); the workers (``worker.run_worker``: in this process for ``--nproc 1``, else spawned with
``cores / N`` threads each), which commit every forward pass; ``assemble``, which publishes the output whole.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO, cast

from ...data.files import count_rows
from ...errors import ConfigError
from .assemble import Totals, assemble
from .job import BatchJob, CheckedJob, check, display, requested_record, split_rows
from .progress import Progress, job_line, plural, say
from .shell import WorkerFailed, run_owned
from .state import JobRecord
from .worker import WorkerSettings, load_predictor, run_worker, spawned

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def run(job: BatchJob, stdout: TextIO | None = None, stderr: TextIO | None = None, predictor: Any = None) -> int:
    """Run ``job`` to its published output; the exit status (0, or ``EXIT_REJECTED`` with ``--strict``).
    ``predictor``: an already loaded one, for ``--nproc 1`` (tests); else each worker loads the checkpoint."""
    checked = check(job)

    def compute() -> tuple[Totals, Progress]:
        return _compute(checked, _prepare(checked), stderr or sys.stderr, predictor)

    return run_owned(checked, compute, stdout or sys.stdout)


def _prepare(checked: CheckedJob) -> JobRecord:
    """The job in the progress folder: this one continued, or started (its rows counted and split)."""
    job, state = checked.job, checked.state
    request = requested_record(checked)
    existing = state.read_job()
    if existing is not None:
        difference = existing.difference(request)
        if difference is None and len(existing.ranges) != job.nproc:
            difference = f"--nproc {len(existing.ranges)}"
        if difference is None:
            return existing
        if state.committed_rows():
            raise ConfigError(
                f"predict: {display(checked.output)} is partly computed by a run with {difference} "
                f"({display(state.path)}); repeat that command to finish it, or pass --overwrite to start again"
            )
        state.clear()  # nothing was done: nothing is lost
    counted = [
        replace(shard, rows=count_rows(source, job.max_row_bytes))
        for shard, source in zip(request.inputs, checked.shards)
    ]
    record = replace(request, inputs=counted)
    record.ranges = split_rows(record.total_rows, job.nproc)
    state.write_job(record)
    return record


def _compute(checked: CheckedJob, record: JobRecord, stderr: TextIO, predictor: Any) -> tuple[Totals, Progress]:
    job, state = checked.job, checked.state
    manifests = state.manifests(record)
    done_before = sum(m.done for m in manifests)
    settings = WorkerSettings(checked.threads, job.batch_size, job.max_batch_tokens)
    resuming = f"; continuing: {done_before:,} rows were done" if done_before else ""
    workers = f"{plural(job.nproc, 'worker')} x {plural(checked.threads, 'thread')}"
    say(checked, stderr, job_line(checked, record.total_rows, workers) + resuming)
    pending = [k for k, m in enumerate(manifests) if not m.complete]
    if len(record.ranges) > 1 and pending and job.runtime == "auto":
        auto = _prepare_auto(job.checkpoint, job.batch_size, settings.threads * len(pending))
        say(checked, stderr, f"runtime auto: {auto}")
    progress = Progress(record.total_rows, done_before, job.progress, stderr)
    try:
        if len(record.ranges) == 1 and pending:
            run_worker(state, record, 0, settings, progress.advance, progress.ready, predictor)
        elif pending:
            _run_processes(checked, pending, settings, progress)
    finally:
        progress.close()
    return assemble(checked, record, state.manifests(record)), progress


def _prepare_auto(checkpoint: str, batch_size: int, threads: int) -> str:
    """``--runtime auto`` before the workers start: the int8 model made and checked here, once, on every core the
    workers will use, so that they load it rather than each make it (one session load, ~0.3 s, where it is current);
    what the workers will run, and why."""
    choice = load_predictor(checkpoint, "auto", threads=threads, batch_size=batch_size).choice
    return f"{choice['runtime']} ({choice['reason']})"


def _run_processes(checked: CheckedJob, pending: list[int], settings: WorkerSettings, progress: Progress) -> None:
    """One spawned process per pending worker, each reporting through its own pipe; raises if any fails."""
    processes, pipes = _start_workers(checked, pending, settings)
    errors: list[str] = []
    crashes: list[str] = []
    try:
        _follow(pipes, processes, progress, errors, crashes)
    finally:
        for p in processes.values():
            if p.exitcode is None and (
                errors or crashes or any(q.exitcode not in (None, 0) for q in processes.values())
            ):
                p.terminate()
            p.join(timeout=30)
            if p.exitcode is None:
                p.kill()
                p.join()
    _raise_first_failure(processes, errors, crashes)


def _start_workers(
    checked: CheckedJob, pending: list[int], settings: WorkerSettings
) -> tuple[dict[int, Any], dict[Connection, int]]:
    """The spawned processes by worker, and the read end of each one's pipe (one writer each: no lock, nothing left
    if it is killed). They inherit ``settings.threads`` in the thread variables: no worker takes every core."""
    context = multiprocessing.get_context("spawn")
    processes: dict[int, Any] = {}
    pipes: dict[Connection, int] = {}
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(settings.threads) for name in THREAD_VARIABLES})
    try:
        for k in pending:
            reader, writer = context.Pipe(duplex=False)
            processes[k] = context.Process(
                target=spawned,
                args=(str(checked.state.path), k, settings, writer, os.getpid()),
                name=f"distrinews-predict-{k}",
            )
            processes[k].start()
            writer.close()  # the worker holds the only writer: its exit is the pipe's end
            pipes[reader] = k
    finally:
        for name in THREAD_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update({name: value for name, value in saved.items() if value is not None})
    return processes, pipes


def _follow(
    pipes: dict[Connection, int], processes: dict[int, Any], progress: Progress, errors: list[str], crashes: list[str]
) -> None:
    """Every worker's events until each pipe ends; once one worker fails, the others are stopped."""
    from multiprocessing.connection import wait

    while pipes:
        for reader in cast("list[Connection]", wait(list(pipes), timeout=0.5)):  # the objects it was given
            try:
                kind, k, *rest = reader.recv()
                if kind == "progress":
                    progress.advance(*rest)
                elif kind == "ready":
                    progress.ready()
                elif kind == "error":  # a bad input: its message as it is
                    errors.append(rest[0])
                else:
                    crashes.append(f"worker {k}: {rest[0]}")
            except EOFError:
                pipes.pop(reader)
                reader.close()
        if any(p.exitcode not in (None, 0) for p in processes.values()):
            for p in processes.values():
                if p.exitcode is None:
                    p.terminate()


def _raise_first_failure(processes: dict[int, Any], errors: list[str], crashes: list[str]) -> None:
    """A bad input's message as it is; else the first worker that failed on its own (not one stopped by SIGTERM)."""
    if errors:
        raise ConfigError(errors[0])
    failed = {k: p.exitcode for k, p in processes.items() if p.exitcode != 0}
    if failed:
        k, code = min(failed.items(), key=lambda item: (item[1] == -signal.SIGTERM, item[0]))
        died = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        why = crashes[0] if crashes else died
        raise WorkerFailed(
            f"predict: worker {k} failed ({why}); the rows committed are kept: run the same command again to continue"
        )

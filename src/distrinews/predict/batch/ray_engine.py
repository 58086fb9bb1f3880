"""The Ray engine: ``distrinews predict --input ... --output ... --engine ray``, a batch job on Ray Data.

The local engine's job and answers, on a Ray cluster or a Ray started here::

    read_datasource(CorpusDatasource)    our reader (data.files), one Ray row per window of input rows
      -> map_batches(WindowPredictor)    one model per actor: --nproc actors of --threads CPUs each
      -> iter_batches (input order)      on the driver, into the local engine's writers (outputs.py)
      -> publish                         OUTPUT.rejects.jsonl, then OUTPUT, renamed whole (assemble.py)

Our reader, not ``ray.data.read_json``/``read_csv``/``read_parquet``: those fail the whole read on one line that is
not JSON, not UTF-8 or of the wrong CSV width (or drop it unnamed), so the rejects could not name ``file:line``; their
rows know no row number in the whole input (the default id), no ``--text-field``/``--id-field`` and no AG News
title + description join.

One Ray row per *window* (the local ``--nproc 1`` worker's windows), cut into passes as the local engine cuts them,
so the same texts are padded together and give the same numbers (were texts Ray rows, Ray's blocks would decide the
padding, and probabilities would move by up to ``PADDING_ATOL``).

The driver writes one file (not ``write_parquet``'s folder of parts) in input order (``preserve_order``) and publishes
it as the local engine does: the driver must see the output's folder, and the workers the checkpoint and the inputs,
at the same paths (on a cluster, shared storage). Not resumable: a killed run publishes nothing and the same command
starts again; an ``OUTPUT.partial/`` holding a local run's progress is refused (finish it with ``--engine local``, or
``--overwrite``), so no computed rows are dropped silently.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from ...checkpoint.servable import check_loadable
from ...errors import ConfigError
from .assemble import OutputFiles, Totals
from .job import BatchJob, CheckedJob, check, display, requested_record
from .progress import Progress, job_line, plural, say
from .shell import WorkerFailed, run_owned
from .state import JobRecord, StateError
from .worker import USAGE_ERRORS, WorkerSettings, load_predictor, passes, result_lines

if TYPE_CHECKING:
    import pyarrow as pa  # imported where it is used: Parquet and Ray are extras

RAY_EXTRA = "ray"
TASKS_PER_ACTOR = 4  # read tasks per actor at least, so every actor has blocks to take
TASK_WINDOWS = 256  # at most this many windows a read task (so a task's blocks waiting to be written stay few)
BLOCK_BYTES = 1 << 20  # Ray's target block size for this job: a few windows a block, so results and progress flow
# Reading reserves no CPU: like the local worker's reader thread it runs beside the model, and the actors'
# reservation is the cores they compute on (with every CPU reserved by actors, a reading task would never start).
READ_CPUS = 0
USAGE_ERROR_NAMES = {error.__name__ for error in USAGE_ERRORS}  # as an actor's traceback names them


def require_ray() -> Any:
    """The ``ray`` module with Ray Data, or a one-line ``ConfigError`` naming the extra."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ConfigError(
            f"predict: --engine ray needs Ray Data: pip install 'distrinews[{RAY_EXTRA}]' ({exc})"
        ) from None
    return ray


def run(job: BatchJob, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``job`` on Ray to its published output; the exit status (0, or ``EXIT_REJECTED`` with ``--strict``)."""
    ray = require_ray()
    checked = check(job)

    def compute() -> tuple[Totals, Progress]:
        _refuse_local_progress(checked)
        check_loadable(checked.checkpoint)  # here: a refused checkpoint is one line, not every actor's traceback
        record = requested_record(checked, resumable=False)
        started = _connect(ray, job.ray_address)
        try:
            return _compute(checked, record, stderr or sys.stderr, ray)
        finally:
            if started:
                ray.shutdown()

    return run_owned(checked, compute, stdout or sys.stdout)


def _refuse_local_progress(checked: CheckedJob) -> None:
    """Empty ``OUTPUT.partial/`` for this run, unless it holds a local run's progress (refused)."""
    state = checked.state
    if state.job_path.exists() and state.committed_rows() > 0:
        raise ConfigError(
            f"predict: {display(checked.output)} is partly computed by the local engine ({display(state.path)}); "
            "finish it with --engine local (the resumable engine), or pass --overwrite to start again on Ray"
        )
    state.clear()  # a killed Ray run's temporary files, or a local run that had done nothing


def _connect(ray: Any, address: str | None) -> bool:
    """Join the cluster at ``address`` (else ``RAY_ADDRESS``), else start Ray here; True if this call started it."""
    if ray.is_initialized():  # the caller's Ray (tests, notebooks): used as it is, and left running
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            # "local": a Ray of its own, even where a `ray start` cluster (or its stale address file) is on this machine
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"predict: could not start or join {where} ({why})") from None
    return True


def _compute(checked: CheckedJob, record: JobRecord, stderr: TextIO, ray: Any) -> tuple[Totals, Progress]:
    job, total = checked.job, record.total_rows
    settings = WorkerSettings(checked.threads, job.batch_size, job.max_batch_tokens)
    windows = -(-total // settings.window_rows)
    tasks = min(windows, max(TASKS_PER_ACTOR * job.nproc, -(-windows // TASK_WINDOWS)))
    workers = f"Ray engine, {plural(job.nproc, 'actor')} x {plural(checked.threads, 'CPU')} ({_where(ray)})"
    say(checked, stderr, job_line(checked, total, f"{workers}, {plural(tasks, 'read task')}"))
    progress = Progress(total, 0, job.progress, stderr)
    written = _InOrder(checked, progress)
    try:
        with _ray_data_settings(ray):
            for window in _results(ray, checked, record, settings, tasks) if total else iter(()):
                written.add(window)
            totals = written.publish(total)
        if written.ran_on:
            say(checked, stderr, _ran_on(written.ran_on))
    except Exception as exc:
        if (error := _user_error(exc)) is None:
            raise
        raise error from None
    finally:
        written.close()
        progress.close()
    return totals, progress


@contextlib.contextmanager
def _ray_data_settings(ray: Any) -> Iterator[None]:
    """Ray Data set for this job while it runs, as it was after: results in input order (written as they come), no bar
    of its own (ours is the one bar), our block size, its plan and timings not logged (its logs folder keeps them)."""
    context = ray.data.DataContext.get_current()
    options = context.execution_options
    saved = (options.preserve_order, context.enable_progress_bars, context.target_max_block_size)
    options.preserve_order, context.enable_progress_bars, context.target_max_block_size = True, False, BLOCK_BYTES
    quiet = logging.getLogger("ray.data")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        yield
    finally:
        options.preserve_order, context.enable_progress_bars, context.target_max_block_size = saved
        quiet.setLevel(level)


class _InOrder:
    """The windows Ray returns, checked to come in input order and written to the output files as they come."""

    def __init__(self, checked: CheckedJob, progress: Progress) -> None:
        self.checked, self.progress = checked, progress
        self.files: OutputFiles | None = None
        self.expected = 0
        self.ran_on: dict[str, int] = {}  # rows by the node that computed them (the copy that reached the driver)

    def add(self, window: dict[str, Any]) -> None:
        if self.files is None:
            self.progress.ready()
            self.files = self._open(window["labels"])
        if window["start"] != self.expected:
            raise StateError(f"Ray returned rows from {window['start']} where {self.expected} was next")
        for line in window["records"]:
            self.files.add(json.loads(line))
        self.expected = window["end"]
        self.ran_on[window["node"]] = self.ran_on.get(window["node"], 0) + window["end"] - window["start"]
        self.progress.advance(window["end"] - window["start"], window["labelled"], window["rejected"])

    def publish(self, total: int) -> Totals:
        if self.files is None:  # no rows: an empty output with the checkpoint's labels (its columns)
            from ..predictor import checkpoint_labels

            self.files = self._open(checkpoint_labels(self.checked.checkpoint) or [])
        self.files.publish(total)
        return self.files.totals

    def _open(self, labels: list[str]) -> OutputFiles:
        return OutputFiles(self.checked, labels, string_ids=self.checked.job.id_field is not None)

    def close(self) -> None:
        if self.files is not None:
            self.files.close()


def _ran_on(rows_by_node: dict[str, int]) -> str:
    """Where the rows were computed: each node's address and id, and its rows."""
    nodes = sorted(rows_by_node.items(), key=lambda item: (-item[1], item[0]))
    return f"computed on {plural(len(nodes), 'node')}: " + ", ".join(f"{node} {rows:,} rows" for node, rows in nodes)


def _where(ray: Any) -> str:
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return f"{plural(len(nodes), 'node')}, {ray.cluster_resources().get('CPU', 0):g} CPUs"
    except Exception:  # a description only
        return "Ray"


def _results(
    ray: Any, checked: CheckedJob, record: JobRecord, settings: WorkerSettings, tasks: int
) -> Iterator[dict[str, Any]]:
    """Every window's results, in input order: ``{start, end, labels, records, labelled, rejected}``."""
    from .ray_source import CorpusDatasource

    job = checked.job
    source = CorpusDatasource(record, checked.fields, settings.window_rows, tasks)
    dataset = ray.data.read_datasource(source, num_cpus=READ_CPUS).map_batches(
        WindowPredictor,
        fn_constructor_args=(str(checked.checkpoint), job.runtime, settings, job.id_field is not None),
        batch_size=1,  # one window a call: its passes are the local engine's
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=job.nproc),  # `concurrency=N` before Ray 2.51
        num_cpus=checked.threads,
    )
    for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        yield from batch.to_pylist()


def _user_error(exc: BaseException) -> Exception | None:
    """What a failed Ray job reports: the user's error it wraps (one line, exit 2), else ``WorkerFailed`` (exit 1)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, USAGE_ERRORS):
            return ConfigError(str(cause) if isinstance(cause, ConfigError) else str(cause).splitlines()[0])
        cause = getattr(cause, "cause", None) or cause.__cause__ or cause.__context__
    if isinstance(exc, (StateError, ConfigError)) or not type(exc).__module__.startswith("ray"):
        return None
    # An actor that died in its constructor is reported with the traceback as text only: its last line names the error.
    for line in reversed(str(exc).splitlines()):
        name, _, message = line.strip().partition(": ")
        if name.endswith("ModuleNotFoundError") and "'distrinews" in message:
            return ConfigError(
                f"predict: a Ray worker could not import this DistriNews ({message}): "
                "install the same distrinews on every machine of the cluster"
            )
        if message and name.startswith("distrinews.") and name.rsplit(".", 1)[-1] in USAGE_ERROR_NAMES:
            return ConfigError(message)
    why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return WorkerFailed(f"predict: the Ray job failed ({why}); nothing was published: run the same command again")


# ---------------------------------------------------------------------------------------------- the model
def _result_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("labels", pa.list_(pa.string())),
            ("records", pa.list_(pa.string())),  # OutputFiles records (a worker's rows.jsonl lines), in row order
            ("labelled", pa.int64()),
            ("rejected", pa.int64()),
            ("node", pa.string()),  # where the window was computed: "ADDRESS (node ID)"
        ]
    )


class WindowPredictor:
    """The stateful ``map_batches`` class: one model per actor (the local worker's loader), windows in, records out."""

    def __init__(self, checkpoint: str, runtime: str, settings: WorkerSettings, with_id: bool):
        # the driver's bar is the one (a cluster's workers lack our env)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        self.predictor = load_predictor(checkpoint, runtime, settings.threads, settings.batch_size)
        self.labels = list(self.predictor.labels)
        self.settings, self.with_id = settings, with_id
        import ray

        self.node = f"{ray.util.get_node_ip_address()} (node {ray.get_runtime_context().get_node_id()[:8]})"

    def __call__(self, windows: Any) -> Any:
        import pyarrow as pa

        out: dict[str, list[Any]] = {name: [] for name in _result_schema().names}
        for window in windows.to_pylist():
            records = [(json.loads(line)["r"], line + "\n") for line in window["rejects"]]
            keys = list(zip(window["rows"], [json.loads(i) for i in window["ids"]]))
            for batch in passes(keys, window["texts"], self.predictor.encode, self.settings):
                records += zip([row for row, _, _ in batch], result_lines(self.predictor, batch, self.with_id))
            records.sort(key=lambda pair: pair[0])
            out["start"].append(window["start"])
            out["end"].append(window["end"])
            out["labels"].append(self.labels)
            out["records"].append([line.rstrip("\n") for _, line in records])
            out["labelled"].append(len(window["texts"]))
            out["rejected"].append(len(window["rejects"]))
            out["node"].append(self.node)
        return pa.Table.from_pydict(out, schema=_result_schema())

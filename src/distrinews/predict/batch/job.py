"""What a batch job is asked to do (``BatchJob``: the command's options) and the checks made before any model loads.

``check`` gives a ``CheckedJob`` or a one-line ``ConfigError`` (exit 2), writing nothing: a missing input or
checkpoint, an unknown format, an output already complete (without ``--overwrite``), one read back as input.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ...data.fields import TEXT_CHARS, RowFields
from ...data.files import MAX_ROW_BYTES, SUFFIXES, Shard, count_rows, format_of, require_pyarrow, resolve_inputs
from ...errors import ConfigError
from ...options import Option, check_options, options_of
from ...options.shared import BATCH_SIZE, MAX_BATCH_TOKENS, MIN_CONFIDENCE, RUNTIME, TEXT_FIELD, THREADS
from ..confidence import ConfidenceThreshold
from ..derived import hash_file
from ..predictor import checkpoint_labels
from .state import REJECTS_SUFFIX, JobRecord, ShardRecord, StateDir, state_dir_of

# Files of a checkpoint folder that decide its answers (the model card, README.md, does not).
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".txt", ".model")
PROGRESS_MODES = ("auto", "bar", "lines", "none")
ENGINES = ("local", "ray")
EXIT_REJECTED = 3  # --strict and some rows were rejected


@dataclass
class BatchJob:
    """``distrinews predict --input ... --output ...``: every option, declared once here (the flags are built from
    these fields, ``options_of(BatchJob)``), and the files the job reads and writes."""

    checkpoint: str
    inputs: list[str]
    output: str
    text_field: str = TEXT_FIELD.field()
    id_field: str | None = Option(help="the field written as each row's id (default: the row number, from 0)").field()
    probabilities: bool = Option(default=False, help="also write every class's probability", switch=True).field()
    min_confidence: str | None = MIN_CONFIDENCE.field()
    nproc: int = Option(default=1, help="worker processes, each on its own range of rows", minimum=1).field()
    threads: int = THREADS.field()
    runtime: str = RUNTIME.field()
    batch_size: int = BATCH_SIZE.field()
    max_batch_tokens: int | None = MAX_BATCH_TOKENS.field()
    max_row_bytes: int = Option(
        default=MAX_ROW_BYTES,
        help=f"a longer row (JSONL line, CSV record, Parquet row) goes to the rejects file unread "
        f"(default: {MAX_ROW_BYTES:,}; texts are cut to their first {TEXT_CHARS:,} characters, the server's limit, "
        "before tokenizing)",
        minimum=1,
    ).field()
    overwrite: bool = Option(
        default=False,
        help="start again: drop the progress; the output and its rejects are replaced once the new ones are complete",
        switch=True,
    ).field()
    strict: bool = Option(
        default=False, help=f"exit {EXIT_REJECTED} if any row was rejected (the output is written)", switch=True
    ).field()
    progress: str = Option(
        default="auto", help="auto: a bar on a terminal, else a line every 10 s", choices=PROGRESS_MODES
    ).field()
    engine: str = Option(
        default="local",
        help="local: --nproc processes on this machine, resumable; ray: --nproc Ray Data actors on a Ray "
        "cluster or a Ray started here (pip install 'distrinews[ray]'; not resumable: a killed run starts again)",
        choices=ENGINES,
    ).field()
    ray_address: str | None = Option(
        help="--engine ray: the cluster to join (e.g. HEAD:6379 or ray://HEAD:10001; default: $RAY_ADDRESS, "
        "else a Ray started here)"
    ).field()


JOB_OPTIONS = options_of(BatchJob)


@dataclass
class CheckedJob:
    job: BatchJob
    shards: list[Shard]
    output: Path
    output_format: str
    output_compressed: bool
    state: StateDir
    rejects: Path
    fields: RowFields
    threads: int

    @property
    def checkpoint(self) -> Path:
        return Path(self.job.checkpoint).resolve()


def check(job: BatchJob) -> CheckedJob:
    """Every check that needs no model, in the order a user fixes them; raises one-line ``ConfigError``s."""
    from ...distributed.machine import threads_per_process

    check_options(job, JOB_OPTIONS, ConfigError, prefix="predict: ")
    if job.ray_address and job.engine != "ray":
        raise ConfigError("predict: --ray-address goes with --engine ray")
    if not job.text_field.strip():
        raise ConfigError("predict: --text-field is empty")
    if not Path(job.checkpoint).exists():
        raise ConfigError(f"predict: checkpoint {job.checkpoint} does not exist")
    threshold = ConfidenceThreshold.parse(job.min_confidence)
    if threshold is not None and (labels := checkpoint_labels(job.checkpoint)):
        threshold.for_labels(labels)
    output = Path(job.output).expanduser()
    output_format = format_of(output)
    if output_format is None:
        raise ConfigError(f"predict: --output {job.output}: unknown format (use one of {', '.join(SUFFIXES)})")
    if output_format == "parquet":
        require_pyarrow("writing Parquet")
    shards = resolve_inputs(job.inputs)
    _refuse_output_among_inputs(output, shards, job.inputs)
    if output.is_dir():
        raise ConfigError(f"predict: --output {output} is a folder; name the file to write")
    refuse_finished(output, job.overwrite)
    if job.runtime == "torch-bf16":
        from ..runtimes import bf16_refusal

        if (why := bf16_refusal()) is not None:
            raise ConfigError(why)
    output = output.absolute()
    return CheckedJob(
        job=job,
        shards=shards,
        output=output,
        output_format=output_format,
        output_compressed=output.name.endswith(".gz"),
        state=StateDir(state_dir_of(output)),
        rejects=output.with_name(output.name + REJECTS_SUFFIX),
        fields=RowFields(job.text_field, job.id_field),
        threads=job.threads or threads_per_process(job.nproc),
    )


def refuse_finished(output: Path, overwrite: bool) -> None:
    """A finished output is not computed again without ``--overwrite``: checked before the lock (to fail before any
    file is made) and again once it is held (a run that finished meanwhile published it under that lock)."""
    if output.exists() and not overwrite:
        raise ConfigError(f"predict: {output} already exists (a finished run); pass --overwrite to compute it again")


def _refuse_output_among_inputs(output: Path, shards: list[Shard], specs: list[str]) -> None:
    target = output.resolve()
    if any(s.path == target for s in shards):
        raise ConfigError(f"predict: --output {output} is one of the input files")
    for spec in specs:
        folder = Path(spec).expanduser()
        if folder.is_dir() and target.parent == folder.resolve():
            raise ConfigError(
                f"predict: --output {output} is inside the input folder {spec}, which a later run would read as input"
            )


def requested_record(checked: CheckedJob, resumable: bool = True) -> JobRecord:
    """This run's request as a ``JobRecord``: resumable, with its input files and checkpoint known by their SHA-256
    (rows not yet counted; compared with the one in the progress folder), else with its rows counted (Ray)."""
    inputs = []
    for shard in checked.shards:
        rows = -1 if resumable else count_rows(shard, checked.job.max_row_bytes)  # bad rows included
        digest = hash_file(shard.path).hexdigest() if resumable else ""
        inputs.append(ShardRecord(str(shard.path), shard.format, shard.path.stat().st_size, digest, rows))
    job = checked.job
    return JobRecord(
        inputs=inputs,
        checkpoint=str(checked.checkpoint),
        checkpoint_sha256=checkpoint_sha256(checked.checkpoint, job.runtime) if resumable else "",
        runtime=job.runtime,
        text_field=job.text_field,
        id_field=job.id_field,
        max_row_bytes=job.max_row_bytes,
    )


def checkpoint_sha256(path: Path, runtime: str) -> str:
    """SHA-256 over the files that decide a checkpoint's answers: weights, configs, tokenizer files (and, for the
    ONNX runtimes, the ONNX graphs beside them); a single ``.pt`` file is hashed whole. Names are hashed too."""
    digest = hashlib.sha256()
    if path.is_file():
        files = [path]
    else:
        suffixes = _MODEL_SUFFIXES + ((".onnx",) if runtime.startswith("onnx") else ())
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in suffixes)
    for file in files:
        digest.update(file.name.encode() + b"\0")
        hash_file(file, digest)
    return digest.hexdigest()


def split_rows(total: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous row ranges, one per worker, sizes differing by at most one: concatenated, they are the input order."""
    return [(total * k // workers, total * (k + 1) // workers) for k in range(workers)]


def describe_inputs(shards: list[Shard]) -> str:
    if len(shards) == 1:
        return str(shards[0].path)
    folders = {s.path.parent for s in shards}
    return f"{len(shards)} files" + (f" in {next(iter(folders))}" if len(folders) == 1 else "")


def display(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else as is."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)

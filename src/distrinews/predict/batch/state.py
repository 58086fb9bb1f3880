"""The progress folder beside the output, ``OUTPUT.partial/``, and the records in it.

    OUTPUT.partial/
      lock                  flock'ed by the run that owns the folder (one run at a time)
      job.json              JobRecord: the inputs (path, size, SHA-256, rows), the checkpoint (path, SHA-256 of
                            its files), runtime, fields, each worker's row range
      worker-K/
        lock                flock'ed by worker K
        rows.jsonl          worker K's results (or rejected rows) in commit order; its first ``committed_bytes`` count
        manifest.json       WorkerManifest: which rows are done, how many bytes of rows.jsonl
      output.tmp, rejects.tmp   the final files while they are assembled

Every record is written whole (temporary name, fsync, rename). Nothing in the folder (the folder included) is
followed when it is a symbolic link: the run is refused in one line (``checkpoint.atomic``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate
from pathlib import Path
from typing import Any, TypeVar

from ...checkpoint.atomic import open_new, open_nofollow, read_text_nofollow, remove_entry

STATE_SUFFIX = ".partial"
REJECTS_SUFFIX = ".rejects.jsonl"
JOB_FILE = "job.json"
MANIFEST_FILE = "manifest.json"
ROWS_FILE = "rows.jsonl"
LOCK_FILE = "lock"
JOB_FORMAT = 2
R = TypeVar("R")


class StateError(RuntimeError):
    """The progress folder contradicts itself (a bug, or a file edited by hand): start again with --overwrite."""


def state_dir_of(output: Path) -> Path:
    return output.with_name(output.name + STATE_SUFFIX)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: Any, durable_rename: bool = True) -> None:
    """``path`` holds ``payload`` whole, or its previous content: temporary name, fsync, rename (then fsync the folder;
    ``durable_rename=False`` skips that: a power cut may undo the rename, for a manifest one more pass computed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open_new(tmp, "w") as fh:
        json.dump(payload, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable_rename:
        fsync_dir(path.parent)


@dataclass(frozen=True)
class ShardRecord:
    """One input file as it was when the job started, known by its content: rows already done were read from
    exactly these bytes, so a file rewritten since (even to the same size, its mtime kept) is other input."""

    path: str
    format: str
    size: int
    sha256: str  # of the file's bytes as stored (compressed for .gz); "" where not computed (the Ray engine's run)
    rows: int = -1  # counted once, when the job starts


@dataclass
class JobRecord:
    """``job.json``: what the rows in the folder were computed from, and how the rows are split among workers."""

    inputs: list[ShardRecord]
    checkpoint: str
    checkpoint_sha256: str
    runtime: str
    text_field: str
    id_field: str | None
    max_row_bytes: int
    ranges: list[tuple[int, int]] = field(default_factory=list)  # worker K does rows [start, end)
    format_version: int = JOB_FORMAT

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.inputs)

    def offsets(self) -> list[int]:
        """The global row number of each input file's first row."""
        return [0, *accumulate(s.rows for s in self.inputs)][: len(self.inputs)]

    def difference(self, other: JobRecord) -> str | None:
        """What makes ``other`` (this run's request) a different job from this one, in words; None if it is the same."""
        if [s.path for s in self.inputs] != [s.path for s in other.inputs]:
            return "other input files"
        for mine, theirs in zip(self.inputs, other.inputs):
            if replace(mine, rows=theirs.rows) != theirs:
                return f"input {theirs.path} changed since (its size or SHA-256)"
        if self.checkpoint != other.checkpoint:
            return f"another checkpoint ({self.checkpoint})"
        if self.checkpoint_sha256 != other.checkpoint_sha256:
            return f"checkpoint {self.checkpoint} changed since (its files' SHA-256)"
        for name in ("runtime", "text_field", "id_field", "max_row_bytes"):
            if getattr(self, name) != getattr(other, name):
                flag = f"--{name.replace('_', '-')}"
                return f"{flag} {getattr(self, name)}" if getattr(self, name) is not None else f"no {flag}"
        return None

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> JobRecord:
        payload = _current(payload, JOB_FILE)
        payload["inputs"] = [ShardRecord(**s) for s in payload["inputs"]]
        payload["ranges"] = [tuple(r) for r in payload["ranges"]]
        return cls(**payload)


def _current(payload: dict[str, Any], name: str) -> dict[str, Any]:
    """``payload`` without its ``format_version``, which must be this DistriNews's."""
    if payload.get("format_version") != JOB_FORMAT:
        raise StateError(f"{name} format {payload.get('format_version')!r}, this DistriNews reads {JOB_FORMAT}")
    return {k: v for k, v in payload.items() if k != "format_version"}


@dataclass
class WorkerManifest:
    """``worker-K/manifest.json``: rows ``[start, done_through)`` are done, and so are ``window_done`` of the
    window ``[window[0], window[1])`` being worked on; ``rows.jsonl`` holds them in its first ``committed_bytes``."""

    worker: int
    start: int
    end: int
    done_through: int
    window: tuple[int, int] | None = None
    window_done: list[int] = field(default_factory=list)
    committed_bytes: int = 0
    labels: list[str] | None = None
    labelled: int = 0
    rejected: int = 0
    format_version: int = JOB_FORMAT

    @classmethod
    def fresh(cls, worker: int, start: int, end: int) -> WorkerManifest:
        return cls(worker, start, end, done_through=start)

    @property
    def done(self) -> int:
        return self.done_through - self.start + len(self.window_done)

    @property
    def complete(self) -> bool:
        return self.done_through >= self.end

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> WorkerManifest:
        payload = _current(payload, MANIFEST_FILE)
        payload["window"] = tuple(payload["window"]) if payload.get("window") else None
        return cls(**payload)


@dataclass(frozen=True)
class StateDir:
    """Paths and records of one ``OUTPUT.partial/`` folder."""

    path: Path

    @property
    def job_path(self) -> Path:
        return self.path / JOB_FILE

    def worker_dir(self, k: int) -> Path:
        return self.path / f"worker-{k}"

    def rows_path(self, k: int) -> Path:
        return self.worker_dir(k) / ROWS_FILE

    def manifest_path(self, k: int) -> Path:
        return self.worker_dir(k) / MANIFEST_FILE

    def read_job(self) -> JobRecord | None:
        return _read(self.job_path, JobRecord.from_json)

    def write_job(self, job: JobRecord) -> None:
        write_json_atomic(self.job_path, asdict(job))  # its tuples written as JSON arrays

    def read_manifest(self, k: int) -> WorkerManifest | None:
        return _read(self.manifest_path(k), WorkerManifest.from_json)

    def write_manifest(self, manifest: WorkerManifest) -> None:
        write_json_atomic(self.manifest_path(manifest.worker), asdict(manifest), durable_rename=False)

    def manifests(self, job: JobRecord) -> list[WorkerManifest]:
        """Each worker's manifest; a worker that has not started yet has a fresh one."""
        out = []
        for k, (start, end) in enumerate(job.ranges):
            manifest = self.read_manifest(k) or WorkerManifest.fresh(k, start, end)
            if (manifest.start, manifest.end) != (start, end):
                raise StateError(
                    f"{self.manifest_path(k)} covers rows {manifest.start}-{manifest.end}, job.json says {start}-{end}"
                )
            out.append(manifest)
        return out

    def committed_rows(self) -> int:
        """Rows any worker has committed (0 when nothing would be lost by starting again)."""
        total = 0
        for path in self.path.glob(f"worker-*/{MANIFEST_FILE}"):
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError, StateError):
                total += WorkerManifest.from_json(json.loads(read_text_nofollow(path) or "")).done
        return total

    def clear(self) -> None:
        """Everything but the lock file (which the caller holds); a link is removed, never entered."""
        for child in self.path.iterdir():
            if child.name != LOCK_FILE:
                remove_entry(child)

    def open_rows(self, k: int) -> io.BufferedWriter:
        """Worker ``k``'s ``rows.jsonl`` for appending (made if missing)."""
        return os.fdopen(open_nofollow(self.rows_path(k), os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def _read(path: Path, parse: Callable[[dict[str, Any]], R]) -> R | None:
    """The record at ``path`` (None where there is none); one that does not parse is a ``StateError``."""
    text = read_text_nofollow(path)
    if text is None:
        return None
    try:
        return parse(json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise StateError(f"{path} cannot be read ({exc})") from None

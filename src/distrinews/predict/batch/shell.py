"""What both engines (``engine``, ``ray_engine``) do around their computing: one run at a time per output, a finished
output never computed again without ``--overwrite``, nothing left behind by a run that did nothing, the summary line
and the exit status.

``--overwrite`` drops the progress folder, never the published files: the new output and rejects replace the old
ones by rename when complete (``OutputFiles.publish``), so a run interrupted at any point leaves them as they were.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TextIO

from ...checkpoint.file_lock import FileLock
from ...errors import ConfigError
from .assemble import Totals
from .job import EXIT_REJECTED, CheckedJob, display, refuse_finished
from .progress import Progress, summary
from .state import LOCK_FILE, StateError

Compute = Callable[[], tuple[Totals, Progress]]


class WorkerFailed(RuntimeError):
    """A worker process died or raised; what it committed is kept, and the same command continues."""


def run_owned(checked: CheckedJob, compute: Compute, stdout: TextIO) -> int:
    """Run ``compute`` (it publishes the output) holding the output's lock; the exit status (0, or ``EXIT_REJECTED``
    with ``--strict``). A ``StateError`` (a progress folder that contradicts itself) is a one-line ``ConfigError``."""
    state = checked.state
    lock = FileLock(state.path / LOCK_FILE)
    if not lock.acquire():
        raise ConfigError(f"predict: another run (process {lock.holder()}) is writing {checked.output}")
    try:
        try:
            refuse_finished(checked.output, checked.job.overwrite)  # again, under the lock
            if checked.job.overwrite:
                state.clear()  # an unfinished run's rows; the published files stay until the new ones replace them
            totals, progress = compute()
        except StateError as exc:
            raise ConfigError(f"predict: {exc}; pass --overwrite to start again") from None
        except BaseException:
            if state.path.is_dir() and not state.committed_rows():
                shutil.rmtree(state.path, ignore_errors=True)  # nothing done yet: leave nothing behind
            raise
    finally:
        lock.release()
    rejects = display(checked.rejects) if totals.rejected else None
    line = summary(totals.rows, totals.labelled, totals.rejected, progress, display(checked.output), rejects)
    print(line, file=stdout, flush=True)
    return EXIT_REJECTED if checked.job.strict and totals.rejected else 0

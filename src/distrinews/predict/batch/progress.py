"""What a batch job prints while it runs (stderr) and when it ends (stdout, one line).

On a terminal, a tqdm bar: rows, rows/s and the time left (the total is counted when the job
starts). Elsewhere (a log file, CI), a plain line every ``Progress.every_s`` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from .job import CheckedJob, describe_inputs, display

if TYPE_CHECKING:
    from tqdm import tqdm


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def job_line(checked: CheckedJob, total: int, workers: str) -> str:
    """The job in words: rows, inputs and output, ``workers``, runtime and passes."""
    job = checked.job
    tokens = f" / {job.max_batch_tokens:,} tokens" if job.max_batch_tokens else ""
    return (
        f"{total:,} rows in {describe_inputs(checked.shards)} -> {display(checked.output)}: {workers}, "
        f"runtime {job.runtime}, passes of <= {job.batch_size} texts{tokens}"
    )


def say(checked: CheckedJob, stderr: TextIO, line: str) -> None:
    """``predict: line`` on stderr, unless ``--progress none``."""
    if checked.job.progress != "none":
        stderr.write(f"predict: {line}\n")
        stderr.flush()


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


class Progress:
    """Counts rows as workers commit them; draws a bar, prints lines, or stays quiet (``mode``: bar | lines | none)."""

    every_s = 10.0  # seconds between two lines

    def __init__(self, total: int, done_before: int, mode: str = "auto", stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.mode = ("bar" if self.stream.isatty() else "lines") if mode == "auto" else mode
        self.total, self.done_before = total, done_before
        self.rows = self.labelled = self.rejected = 0  # this run's
        self.started = time.monotonic()
        self.computing: float | None = None  # when the first worker had its model loaded
        self._last_line = self.started
        # drawn once a model is loaded, so its rate and time left leave the loading out
        self._bar: tqdm[Any] | None = None

    @property
    def computing_s(self) -> float:
        """Seconds since the first worker was ready (its model loaded): what the speed is measured over."""
        return time.monotonic() - (self.computing if self.computing is not None else self.started)

    def ready(self) -> None:
        if self.computing is None:
            self.computing = self._last_line = time.monotonic()  # the first line measures a rate, not the loading
        if self.mode == "bar" and self._bar is None:
            from tqdm import tqdm

            initial = self.done_before + self.rows
            self._bar = tqdm(
                total=self.total, initial=initial, unit="rows", unit_scale=True, file=self.stream, dynamic_ncols=True
            )

    def rate(self) -> float:
        return self.rows / self.computing_s if self.computing_s > 0 else 0.0

    def advance(self, rows: int, labelled: int, rejected: int) -> None:
        self.rows += rows
        self.labelled += labelled
        self.rejected += rejected
        if self.mode == "bar":
            self.ready()  # a worker's first rows arrived before its ready event
            assert self._bar is not None, "ready() draws the bar"
            self._bar.update(rows)
            if rejected:
                self._bar.set_postfix(rejected=self.rejected, refresh=False)
        elif self.mode == "lines" and time.monotonic() - self._last_line >= self.every_s:
            self._last_line = time.monotonic()
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        done = self.done_before + self.rows
        share = f" ({100 * done / self.total:.1f}%)" if self.total else ""
        rate = self.rate()
        left = f", {_duration((self.total - done) / rate)} left" if rate > 0 and self.total else ""
        return f"predict: {done:,}/{self.total:,} rows{share}, {rate:,.1f} rows/s{left}, {self.rejected:,} rejected"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def summary(rows: int, labelled: int, rejected: int, progress: Progress, output: str, rejects: str | None) -> str:
    """The run's last line: rows read, labelled, rejected, and this run's speed."""
    where = f" (see {rejects})" if rejected and rejects else ""
    before = f"; {progress.done_before:,} done by an earlier run" if progress.done_before else ""
    loaded = progress.computing
    loading = f" after {_duration(loaded - progress.started)} loading" if loaded is not None else ""
    return (
        f"predict: {rows:,} rows read, {labelled:,} labelled, {rejected:,} rejected{where} -> {output}; "
        f"{progress.rate():,.1f} rows/s ({progress.rows:,} rows in {_duration(progress.computing_s)}{loading}{before})"
    )

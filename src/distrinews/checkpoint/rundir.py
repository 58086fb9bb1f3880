"""The run directory's layout, and the rule that one directory holds one run.

    runs/<name>/
      config.yaml            resolved config of the run
      log.jsonl              one JSON object per logged step / eval (rank 0)
      tb/                    TensorBoard event files
      checkpoints/step-N/    resumable checkpoints
      best/                  the servable model with the best test accuracy so far
      mlflow_run.json        the MLflow run this run reports to (report_to: mlflow), continued on resume

A directory that already holds a run is continued (``--resume auto``) or replaced (``--overwrite_output_dir true``),
never mixed with a new one (whose checkpoints the old run's higher steps would rotate away). While the run lasts, the
process that writes (or the launcher of its workers) holds an exclusive lock on the directory (``RunLock``), taken
before the directory is checked, so that two runs started at once cannot both find it free.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..config import ConfigError, TrainConfig
from .atomic import remove_entry, symlink_refused
from .file_lock import RETRY_S, FileLock, LocksUnsupported

# Not an artifact: it outlives --overwrite_output_dir (which runs under the lock) and says nothing about a previous run.
LOCK_FILE = ".distrinews.lock"
# Set by a launcher that holds the lock, for its workers: the lock is the launcher's, and a worker taking it again would
# be refused.
LOCK_HELD_ENV = "DISTRINEWS_RUN_DIR_LOCKED"


class _Entry:
    """A path of the run directory, declared once by its name (``RunDir.config`` is ``<run dir>/config.yaml``)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, run_dir: RunDir, owner: type) -> Path:
        return run_dir.path / self.name


class RunDir:
    config = _Entry("config.yaml")
    log = _Entry("log.jsonl")
    tensorboard = _Entry("tb")
    checkpoints = _Entry("checkpoints")
    best = _Entry("best")
    curves = _Entry("training_curves.png")
    confusion = _Entry("confusion_matrix.png")
    reliability = _Entry("reliability_diagram.png")
    coverage = _Entry("coverage_accuracy.png")
    mlflow_run = _Entry("mlflow_run.json")
    lock_file = _Entry(LOCK_FILE)

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def lock(self) -> RunLock:
        """Take the run's lock (creating the directory), or fail naming the run that holds it."""
        return RunLock(self).acquire()

    def locked_by_launcher(self) -> bool:
        return os.environ.get(LOCK_HELD_ENV) == str(self.lock_file.resolve())

    def previous_run(self) -> list[str]:
        """The artifacts of an earlier run found here (empty for a new or empty directory)."""
        entries = [(name, self.path / name) for name in RUN_ARTIFACTS]
        return [name for name, p in entries if p.is_file() or (p.is_dir() and any(p.iterdir()))]

    def check_usable(self, resume: str | None, overwrite: bool) -> None:
        """Fail, naming the field, when the directory cannot take this run; touches nothing."""
        self.check_writable()
        previous = self.previous_run()
        if previous and resume is None and not overwrite:
            raise ConfigError(
                f"config field 'output_dir': {self.path} already holds a run ({', '.join(previous)}); "
                "pass --resume auto to continue it, or --overwrite_output_dir true to replace it"
            )

    def check_writable(self) -> None:
        parent = next(p for p in (self.path, *self.path.parents) if p.exists())  # "." or "/" at the latest
        if not parent.is_dir():
            raise ConfigError(
                f"config field 'output_dir': {self.path} is under {parent}, which is a file, not a directory"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"config field 'output_dir': cannot write to {parent} (permission denied)")

    def prepare(self, config: TrainConfig, resumed: bool) -> None:
        """Rank 0, before anything is written: save the config, remove leftovers of killed saves. A run that does not
        continue a checkpoint starts clean (``check_usable`` let it in only for an empty or replaceable directory)."""
        if not resumed:
            self.clear()
        self.path.mkdir(parents=True, exist_ok=True)
        for directory in (self.path, self.checkpoints):
            clean_stale_tmp(directory)
        if self.config.is_symlink():  # save_yaml would write through it
            raise symlink_refused(self.config)
        config.save_yaml(self.config)

    def clear(self) -> None:
        for name in RUN_ARTIFACTS:
            remove_entry(self.path / name)  # a link is removed, never entered


# What a run writes (every entry but the lock); the only things ``--overwrite_output_dir`` removes (never a user's
# other files).
RUN_ARTIFACTS = tuple(e.name for e in vars(RunDir).values() if isinstance(e, _Entry) and e.name != LOCK_FILE)


class RunLock:
    """An exclusive ``FileLock`` on ``<run dir>/.distrinews.lock`` until ``release()`` or the process ends; the pid
    and host in the file name the holder to the run that is refused."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self.path = run_dir.lock_file
        # A planted link would be truncated: the file is never followed. A run that wrote nothing removed the
        # directory as it ended: it is made again.
        self._file = FileLock(self.path, make_parent=lambda _: self._make_dir(), name_holder=_holder_json, mode=0o666)
        self._created: list[Path] = []

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> RunLock:
        self.run_dir.check_writable()
        self._created = [p for p in (self.run_dir.path, *self.run_dir.path.parents) if not p.exists()]
        try:
            self._make_dir()
            self._lock()
        except BaseException:
            self._remove_created()
            raise
        return self

    def _lock(self) -> None:
        try:
            if self._file.acquire():
                return
        except LocksUnsupported as exc:
            # Some network file systems are mounted without lock support; refusing every run there would be worse.
            print(
                f"warning: cannot lock {self.path} ({exc.strerror}): nothing stops a second run in this directory",
                file=sys.stderr,
            )
            return
        except OSError as exc:
            raise ConfigError(
                f"config field 'output_dir': cannot create the lock file {self.path}: {exc.strerror}"
            ) from exc
        raise ConfigError(
            f"config field 'output_dir': {self.run_dir.path} is locked by a run in progress "
            f"({self._holder()}, lock file {self.path}); wait for it to end, or choose another --output-dir"
        ) from None

    def _holder(self) -> str:
        # The holder writes its name just after it gets the lock: give it a moment to do so.
        for _ in range(20):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                info = json.loads(self._file.holder())
                return f"pid {info['pid']} on {info['host']} since {info['since']}"
            time.sleep(RETRY_S)
        return "holder unknown"

    def _make_dir(self) -> None:
        try:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"config field 'output_dir': cannot create {self.run_dir.path}: {exc.strerror}") from exc

    def release(self) -> None:
        """Let go, and leave the directory as it was found: no lock file, no directory made only for it."""
        self._file.release(remove=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for p in self._created:
            try:
                p.rmdir()
            except OSError:
                break  # the run wrote into it (or someone else did): keep it and everything above
        self._created = []


def _holder_json() -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})


def clean_stale_tmp(directory: Path) -> None:
    """Remove leftovers of saves that were killed midway (never a published checkpoint). A kill between the two
    renames of ``atomic.publish_dir`` leaves the published folder moved aside (``.old-NAME-PID-NS``) and nothing at
    NAME: that folder is the last published version, so it is put back (only a real folder: a planted link is
    removed like any leftover, never followed)."""
    if not directory.is_dir():
        return
    aside = [p for p in directory.iterdir() if p.name.startswith(".old-") and p.is_dir() and not p.is_symlink()]
    for p in sorted(aside, key=lambda p: p.name.rsplit("-", 1)[-1].rjust(24, "0"), reverse=True):  # newest first
        final = directory / p.name[len(".old-") :].rsplit("-", 2)[0]
        if not final.exists() and not final.is_symlink():
            os.replace(p, final)
    for p in directory.iterdir():
        if p.name.startswith((".tmp-", ".old-")):
            with contextlib.suppress(OSError):
                remove_entry(p)

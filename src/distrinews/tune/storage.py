"""Where a study lives: Optuna's journal file (the default: one file, several processes on one machine
or on a shared file system) or a database URL (``sqlite:///…``, ``postgresql://…``, ``mysql://…``:
several tuners on several machines).

A trial whose tuner died must not stay RUNNING for ever: the tuner running it records a heartbeat
every ``heartbeat_interval`` seconds, and the next tuner to start a trial marks a trial whose
heartbeat is older than ``grace_period`` failed and queues its parameters again as a new trial
(Optuna's ``RetryHeartbeatStaleTrialCallback``; ``failed_trial`` names the trial it retries).
``RDBStorage`` has this built in. Optuna's journal storage has no heartbeat, so ``JournalHeartbeatStorage``
gives it one through Optuna's own heartbeat interface (``BaseHeartbeat``): the beat is a trial system
attribute, which every process reading the journal sees; Optuna's trial loop then records and checks it
exactly as it does for a database.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import optuna.storages.journal
from optuna.storages import RetryHeartbeatStaleTrialCallback

# Optuna's heartbeat interface, which RDBStorage implements; not exported, so this import is checked by the tests
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

from ..errors import ConfigError

__all__ = ["HEARTBEAT_ATTR", "JournalHeartbeatStorage", "is_database_url", "open_storage"]

HEARTBEAT_ATTR = "distrinews:heartbeat"
RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def is_database_url(storage: str) -> bool:
    scheme = storage.split(":", 1)[0].split("+", 1)[0].lower()
    return "://" in storage and scheme in RDB_SCHEMES


def open_storage(
    storage: str,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    max_retry: int | None = None,
) -> optuna.storages.BaseStorage:
    """``storage``: a database URL, or the path of a journal file (made when missing). With ``heartbeat_interval``
    (seconds), trials beat and stale ones are failed and retried (up to ``max_retry`` times each)."""
    with warnings.catch_warnings():  # experimental since Optuna 2.8, and what RDBStorage's documentation pairs it with
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry) if heartbeat_interval else None
    if is_database_url(storage):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    storage,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=retry,
                )
        except Exception as exc:  # sqlalchemy's errors: a driver missing, a server unreachable, a bad URL
            raise ConfigError(
                f"--storage {_redacted(storage)}: cannot open it: {type(exc).__name__}: {exc}".splitlines()[0]
            ) from None
    if "://" in storage:
        raise ConfigError(
            f"--storage {_redacted(storage)}: a database URL ({', '.join(RDB_SCHEMES)}) or the path of a journal file"
        )
    path = Path(storage)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(f"--storage {path}: must be a regular file (a journal), not a link or a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    if heartbeat_interval is None:
        return optuna.storages.JournalStorage(backend)
    return JournalHeartbeatStorage(backend, heartbeat_interval, grace_period, retry)


def _redacted(url: str) -> str:
    """The URL without its password (it goes into error lines and logs)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


class JournalHeartbeatStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """A journal with Optuna's heartbeat: the beat is the trial's ``HEARTBEAT_ATTR`` (seconds since the epoch)."""

    def __init__(self, backend: Any, interval: int, grace: int | None, callback: Callable | None):
        super().__init__(backend)
        self._interval, self._grace, self._callback = interval, grace or 2 * interval, callback

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        # Wall clocks: the beats of several machines compare only as well as their clocks agree (NTP, well inside
        # a grace period of minutes); a database's heartbeat uses the server's clock instead.
        now = time.time()
        running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        return [
            t._trial_id
            for t in running
            if HEARTBEAT_ATTR in t.system_attrs and now - float(t.system_attrs[HEARTBEAT_ATTR]) > self._grace
        ]

    def get_heartbeat_interval(self) -> int | None:
        return self._interval

    def get_heartbeat_stale_trial_callback(self) -> Callable | None:
        return self._callback

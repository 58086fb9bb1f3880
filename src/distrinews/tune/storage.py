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

A database URL may hold a password. A command line is visible to every user of the machine (``ps``), so the URL
can come from ``STORAGE_ENV`` or a file (``--storage-file``) instead of ``--storage``; the tuner passes it to its
trials in their environment (``TRIAL_ENV``), never on their command line, and every line it or a trial says about
the storage shows the URL ``redacted`` and any error's text ``scrubbed`` of the password.
"""

from __future__ import annotations

import os
import time
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import optuna.storages.journal
from optuna.storages import RetryHeartbeatStaleTrialCallback

# Optuna's heartbeat interface, which RDBStorage implements; not exported, so this import is checked by the tests
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from ..errors import ConfigError
from .outage import DatabaseStorage  # RDBStorage, riding out a database restart

HEARTBEAT_ATTR = "distrinews:heartbeat"
RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")
# The storage when neither --storage nor --storage-file names one: a URL with a password stays off the command line
STORAGE_ENV = "DISTRINEWS_TUNE_STORAGE"
MAX_STORAGE_FILE_BYTES = 64 << 10
StaleCallback = Callable[[optuna.Study, FrozenTrial], None]


def storage_url(flag: str | None, file: str | None) -> str | None:
    """``--storage``, else the first line of ``--storage-file``, else ``$STORAGE_ENV``; None: the default journal."""
    if flag and file:
        raise ConfigError("--storage and --storage-file name the same thing: give one")
    if flag:
        return flag
    if file:
        try:
            with open(file, "rb") as f:
                text = f.read(MAX_STORAGE_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"--storage-file {file}: cannot read it ({exc.strerror})") from None
        url = text.decode("utf-8", "replace").strip().splitlines()[0].strip() if text.strip() else ""
        if not url or len(text) > MAX_STORAGE_FILE_BYTES:
            raise ConfigError(f"--storage-file {file}: want one line, a database URL or a journal's path")
        return url
    return os.environ.get(STORAGE_ENV) or None


def has_password(url: str) -> bool:
    return bool(_password(url))


def is_database_url(storage: str) -> bool:
    scheme = storage.split(":", 1)[0].split("+", 1)[0].lower()
    return "://" in storage and scheme in RDB_SCHEMES


def open_storage(
    storage: str, heartbeat_interval: int | None = None, grace_period: int | None = None, max_retry: int | None = None
) -> optuna.storages.BaseStorage:
    """``storage``: a database URL, or the path of a journal file (made when missing). With ``heartbeat_interval``
    (seconds), trials beat and stale ones are failed and retried (up to ``max_retry`` times each)."""
    with warnings.catch_warnings():  # experimental since Optuna 2.8, and what RDBStorage's documentation pairs it with
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry) if heartbeat_interval else None
        try:
            if is_database_url(storage):
                beats = {"heartbeat_interval": heartbeat_interval, "grace_period": grace_period}
                return DatabaseStorage(storage, heartbeat_stale_trial_callback=retry, **beats)
        except Exception as exc:  # sqlalchemy's errors: a driver missing, a server unreachable, a bad URL
            why = scrubbed(f"{type(exc).__name__}: {exc}", storage).splitlines()[0]
            raise ConfigError(f"--storage {redacted(storage)}: cannot open it: {why}") from None
    if "://" in storage:
        raise ConfigError(
            f"--storage {redacted(storage)}: a database URL ({', '.join(RDB_SCHEMES)}) or the path of a journal file"
        )
    path = Path(storage)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(f"--storage {path}: must be a regular file (a journal), not a link or a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    if heartbeat_interval is None:
        return optuna.storages.JournalStorage(backend)
    return JournalHeartbeatStorage(backend, heartbeat_interval, grace_period, retry)


def _password(url: str) -> str:
    """The password in ``scheme://user:password@host...`` as written ("" when there is none)."""
    authority = url.split("://", 1)[1] if "://" in url else ""
    credentials = authority.rsplit("@", 1)[0] if "@" in authority else ""  # a password may hold "@"; a host never does
    return credentials.split(":", 1)[1] if ":" in credentials else ""


def redacted(url: str) -> str:
    """The URL with its password replaced by ***, for error lines and logs."""
    secret = _password(url)
    if not secret:
        return url
    scheme, authority = url.split("://", 1)
    credentials, host = authority.rsplit("@", 1)
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error's, which may quote the URL) with the URL's password, as written or decoded, as ***."""
    secret = _password(url)
    for form in {secret, urllib.parse.unquote(secret)} - {""}:
        text = text.replace(form, "***")
    return text


class JournalHeartbeatStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """A journal with Optuna's heartbeat: the beat is the trial's ``HEARTBEAT_ATTR`` (seconds since the epoch)."""

    def __init__(self, backend: Any, interval: int, grace: int | None, callback: StaleCallback | None):
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

    def get_heartbeat_stale_trial_callback(self) -> StaleCallback | None:
        return self._callback

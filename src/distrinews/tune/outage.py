"""A study's database that restarts, fails over or drops off the network mid-study: the tuners wait for it.

What a tuner asks of the storage between trials (fail stale trials, count them, start one) and at a trial's end
(its outcome) is tried again every ``RETRY_S`` seconds while the storage does not answer, for up to ``OUTAGE_S``
seconds, with one warning line; only then does the tuner end, in one line. An outcome is told once the storage is
back, so a restart while trials run costs nothing. A trial that the outage caught before its training started is
left RUNNING and runs again once its heartbeat is stale; one whose tuner's heartbeats stopped longer than the grace
period may have been failed as stale by another tuner meanwhile, and run again there: its late outcome is dropped.
At most, the outage cost a retry.

The heartbeat of a running trial beats through an outage (a beat that fails is retried at the next one) instead of
ending its thread, so the trial is not taken for dead once the database is back. Pooled connections are checked
before use (``pool_pre_ping``): a restart leaves every one dead, and a dead one is replaced instead of failing the
query that draws it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.exceptions import StorageInternalError

from ..errors import ConfigError

__all__ = ["OUTAGE_S", "RETRY_S", "STORAGE_ERRORS", "DatabaseStorage", "patiently", "reason"]

# A database that does not answer (refused, reset, a server restarting); RDBStorage wraps a failed commit in
# StorageInternalError
STORAGE_ERRORS = (StorageInternalError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)
OUTAGE_S = 600.0  # a restart takes seconds, a failover a minute or two
RETRY_S = 1.0

T = TypeVar("T")


def reason(exc: BaseException) -> str:
    """The first line of what the database said (StorageInternalError's own message says nothing of the cause)."""
    cause = exc.__cause__ if isinstance(exc, StorageInternalError) and exc.__cause__ else exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def patiently(call: Callable[[], T], what: str, say: Callable[..., None]) -> T:
    """``call()``, tried again every ``RETRY_S`` s while the storage does not answer, for up to ``OUTAGE_S`` s."""
    deadline = None
    while True:
        try:
            return call()
        except STORAGE_ERRORS as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + OUTAGE_S
                say(
                    f"warning: the study's storage did not answer ({what}: {reason(exc)}): "
                    f"trying again every {RETRY_S:g} s for up to {OUTAGE_S:g} s"
                )
            elif now > deadline:
                raise ConfigError(
                    f"the study's storage has not answered for {OUTAGE_S:g} s ({what}: {reason(exc)}); "
                    "the study is kept there: the same command resumes it"
                ) from None
            time.sleep(RETRY_S)


class DatabaseStorage(optuna.storages.RDBStorage):
    """Optuna's database storage, with connections checked before use and a heartbeat that survives an outage."""

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(url, engine_kwargs={"pool_pre_ping": True}, **kwargs)
        self._beating = True

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except STORAGE_ERRORS as exc:  # in the heartbeat thread, which would end: the next beat tries again
            if self._beating:
                say = f"warning: a trial's heartbeat was not recorded ({reason(exc)}): trying again at every beat"
                print(say, file=sys.stderr, flush=True)
            self._beating = False
        else:
            self._beating = True

"""The thread that sends a run's tracking to MLflow, so that a tracking server that is slow, stopped or gone never
holds up training.

The MLflow callback (rank 0) hands each piece of work to ``MlflowSender.put``, which never waits on the network, so
neither does any rank (the others would wait for rank 0 in the next collective). The thread sends it in order,
bounded:

- each HTTP request by MLflow's own ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (``REQUEST_TIMEOUT_S``) and
  ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (0), unless the user set them: MLflow's defaults hold one request for up to
  20 minutes; here the thread does the retrying;
- the queue by ``QUEUE_VALUES`` metric values; metrics that do not fit are dropped and counted (other work waits);
- the end (``close``) by ``END_WAIT_S`` for a server that does not answer and ``END_WAIT_MAX_S`` in all; what is
  left is counted as dropped.

A server that does not answer (a timeout, a refused or reset connection, a 5xx or 429) is an outage: one line when
it starts and one when it ends, the work tried again after 1 s, 2 s, ... up to ``RETRY_MAX_S``. Any other failure
stops tracking with one warning line; training goes on.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..checkpoint.load_errors import exception_chain

REQUEST_TIMEOUT_S = 5
END_WAIT_S = 5.0
END_WAIT_MAX_S = 300.0
QUEUE_VALUES = 10_000
RETRY_MAX_S = 10.0
_HURRIED_RETRY_S = 0.5
# MLflow's variables that bound one request, and the values the sender gives them when the user has not.
_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
_RETRYABLE_STATUS = 429


@dataclass
class Work:
    """One thing to send: ``what`` names it in a warning, ``values`` counts the metric values it carries (0: work
    that is not metrics, which is never dropped for room)."""

    what: str
    send: Callable[[], None]
    values: int = 0


@dataclass
class Tally:
    """What the sender did with the metric values it was given, and the other work it could not send."""

    sent: int = 0
    dropped_full: int = 0  # the queue was full when they were logged
    dropped_unsent: int = 0  # still queued when tracking stopped or the end stopped waiting
    outages: int = 0
    unsent: list[str] = field(default_factory=list)  # the other work not sent: "the artifacts", "ending the run"

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_unsent

    def as_record(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "dropped": self.dropped,
            "dropped_queue_full": self.dropped_full,
            "dropped_unsent": self.dropped_unsent,
            "outages": self.outages,
            "unsent": self.unsent,
        }


def server_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server did not answer or failed (worth trying again), rather than refused the request.

    MLflow wraps the ``requests`` error it got (a timeout as the cause, a connection error as the context); its REST
    errors carry the HTTP status; its artifact repository raises ``requests``' ``HTTPError``.
    """
    import requests
    from mlflow.exceptions import RestException

    for current in exception_chain(exc):
        if isinstance(current, requests.HTTPError):
            response = current.response
            return response is None or response.status_code >= 500 or response.status_code == _RETRYABLE_STATUS
        if isinstance(current, (requests.RequestException, ConnectionError, TimeoutError)):
            return True
        if isinstance(current, RestException):
            status: int = current.get_http_status_code()
            return status >= 500 or status == _RETRYABLE_STATUS
    return False


@contextlib.contextmanager
def http_bounds() -> Iterator[None]:
    """MLflow's requests bounded (``REQUEST_TIMEOUT_S``, no retries) for the block, where the user has not set them."""
    added = [name for name in _HTTP_BOUNDS if name not in os.environ]
    for name in added:
        os.environ[name] = _HTTP_BOUNDS[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def stopped_warning(what: str, exc: BaseException) -> str:
    return f"warning: MLflow tracking stopped ({what}: {first_line(exc)}); training goes on without it"


def _reason(exc: BaseException) -> str:
    """What went wrong in a few words: the network error under MLflow's message (``ReadTimeoutError: Read timed out.
    (read timeout=5)``, ``NewConnectionError: ... Connection refused``), else the message's first line."""
    import requests
    from urllib3.exceptions import MaxRetryError

    for current in exception_chain(exc):
        if isinstance(current, requests.RequestException):
            inner = current.args[0] if current.args else None
            if isinstance(inner, MaxRetryError) and inner.reason is not None:
                inner = inner.reason
            if not isinstance(inner, BaseException):
                return first_line(current)
            # urllib3 starts each message with the connection pool: "HTTPConnectionPool(host=..., port=...): "
            return f"{type(inner).__name__}: {str(inner).split('): ', 1)[-1][:200]}"
    return first_line(exc)


class MlflowSender:
    """The queue and its thread; ``start`` before the first ``put``, ``close`` at the end."""

    def __init__(self, where: str, say: Callable[..., None], limit: int = QUEUE_VALUES):
        self.where, self.say, self.limit = where, say, limit
        self.tally = Tally()
        self.stopped = False  # tracking stopped for good: a refused request, or the end
        self._queue: deque[Work] = deque()
        self._queued_values = 0
        self._away_since: float | None = None  # when the server stopped answering (None: it answers)
        self._hurry = False  # the end is waiting: try again at once
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="distrinews-mlflow", daemon=True)
        self._bounds = contextlib.ExitStack()

    def start(self) -> None:
        self._bounds.enter_context(http_bounds())
        self._thread.start()

    def put(self, work: Work) -> None:
        """Queue ``work``, or count its metric values as dropped when there is no room; never waits."""
        with self._cond:
            if self.stopped:
                self.tally.dropped_unsent += work.values
                return
            if work.values and self._queued_values + work.values > self.limit:
                self.tally.dropped_full += work.values
                return
            self._queue.append(work)
            self._queued_values += work.values
            self._cond.notify_all()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._send_in_order()
        finally:  # however the thread ends, the end never waits for it
            with self._cond:
                self._drop_queued()
                self._cond.notify_all()

    def _send_in_order(self) -> None:
        retry = 0
        while True:
            with self._cond:
                while not self._queue and not self.stopped:
                    self._cond.wait()
                if self.stopped:
                    return
                work = self._queue[0]
            try:
                work.send()
            except Exception as exc:
                if not server_unavailable(exc):
                    self._give_up(work.what, exc)
                    return
                self._unavailable(work.what, exc)
                self._pause(retry)
                retry += 1
                continue
            retry = 0
            self._sent(work)

    def _sent(self, work: Work) -> None:
        with self._cond:
            if self.stopped:  # the end stopped waiting while this was in flight: already counted as dropped
                return
            self._queue.popleft()
            self._queued_values -= work.values
            self.tally.sent += work.values
            back, self._away_since = self._away_since is not None, None
            waiting = self._queued_values
            self._cond.notify_all()
        if back:
            self.say(f"MLflow: the tracking server answers again; sending the {waiting} metric values kept meanwhile")

    def _unavailable(self, what: str, exc: BaseException) -> None:
        with self._cond:
            if self._away_since is not None or self.stopped:
                return
            self._away_since = time.monotonic()
            self.tally.outages += 1
            self._cond.notify_all()
        self.say(
            f"warning: MLflow: the tracking server at {self.where} is unavailable ({what}: {_reason(exc)}); training"
            f" goes on, and up to {self.limit} metric values wait to be sent when it answers"
        )

    def _pause(self, retry: int) -> None:
        with self._cond:
            if not self.stopped:
                self._cond.wait(_HURRIED_RETRY_S if self._hurry else min(2.0**retry, RETRY_MAX_S))

    def _give_up(self, what: str, exc: BaseException) -> None:
        with self._cond:
            if self.stopped:
                return
            self._drop_queued()
            self._cond.notify_all()
        self.say(stopped_warning(what, exc))

    def _drop_queued(self) -> None:
        """Count what is still queued as dropped and stop (with the lock held); once stopped, nothing is queued."""
        self.stopped = True
        self.tally.dropped_unsent += self._queued_values
        unsent = [*self.tally.unsent, *(w.what for w in self._queue if not w.values)]
        self.tally.unsent = list(dict.fromkeys(unsent))  # each kind once, in order
        self._queue.clear()
        self._queued_values = 0

    # ------------------------------------------------------------------ the end
    def close(self, max_wait: float = END_WAIT_MAX_S) -> Tally:
        """Wait for the queue to empty, ``END_WAIT_S`` at most once the server does not answer and ``max_wait`` in
        all; stop the thread and hand back the tally."""
        begun = time.monotonic()
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            while self._queue and not self.stopped:
                now = time.monotonic()
                left = begun + max_wait - now
                if self._away_since is not None:
                    left = min(left, max(self._away_since, begun) + END_WAIT_S - now)
                if left <= 0:
                    break
                self._cond.wait(min(left, _HURRIED_RETRY_S))
            self._drop_queued()
            self._cond.notify_all()
        self._bounds.close()
        return self.tally

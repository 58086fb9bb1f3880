"""A remote ``distrinews serve`` from Python, with the local predictor's ``predict``.

``RemoteClassifier(url, api_key=...).predict(texts)`` answers what ``make_predictor(checkpoint).predict(texts)``
answers here, through the server's own API (``POST /predict``, ``POST /predict/batch`` in chunks of the server's
``--max-batch-texts``). A busy (429) or not ready (503) server, or one that cannot be reached (a restart), is tried
again after its ``Retry-After``, up to ``max_retries`` times; a wait over ``max_retry_wait`` is not waited for. Any
other error is a :class:`RemoteError` with the server's status and message.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import httpx

from .. import tracing

log = logging.getLogger(__name__)

RETRIED_STATUSES = (429, 503)


class RemoteError(RuntimeError):
    """The server refused or failed a request: its HTTP ``status`` and its message (``detail``)."""

    def __init__(self, status: int, detail: str, url: str):
        super().__init__(f"{url}: HTTP {status}: {detail}")
        self.status, self.detail, self.url = status, detail, url


def retry_after(value: str | None, attempt: int) -> float:
    """Seconds to wait: the server's ``Retry-After`` (seconds, or an HTTP date), else 0.5 s doubling per attempt."""
    if value:
        value = value.strip()
        if value.isdigit():
            return float(value)
        with contextlib.suppress(TypeError, ValueError):  # not a date, or one without its zone
            return max(0.0, (email.utils.parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    return 0.5 * 2.0**attempt


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "error"):  # the seed API's errors, TEI's
            if isinstance(body.get(key), str):
                return str(body[key])
    return str(body)[:500]


class RemoteClassifier:
    """A classifier served by ``distrinews serve`` at ``url``; ``api_key`` if the server has one; ``transport`` (an
    ``httpx`` one) for callers that route requests themselves. A context manager, or call :meth:`close`."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 5,
        max_retry_wait: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if max_retries < 0 or max_retry_wait < 0:
            raise ValueError("max_retries and max_retry_wait must be >= 0")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.max_retries, self.max_retry_wait = max_retries, max_retry_wait
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._info: dict[str, Any] | None = None

    def predict(self, texts: str | Sequence[str]) -> Any:
        """One result per text, in order (a list); for one text given as a string, its result alone."""
        if isinstance(texts, str):
            return self._request("POST", "/predict", {"text": texts})
        texts = list(texts)
        results: list[dict[str, Any]] = []
        step = self.max_batch_texts
        for start in range(0, len(texts), step):
            results.extend(self._request("POST", "/predict/batch", {"texts": texts[start : start + step]}))
        return results

    def info(self) -> dict[str, Any]:
        """The server's ``GET /info``: the model, its labels and metrics, the runtime and the limits (read once)."""
        if self._info is None:
            self._info = self._request("GET", "/info")
        return self._info

    @property
    def labels(self) -> list[str]:
        return list(self.info()["labels"])

    @property
    def max_batch_texts(self) -> int:
        return int(self.info()["limits"]["max_batch_texts"])

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                # The caller's trace continues in the server's (W3C traceparent), when the caller traces.
                response = self._client.request(method, path, json=body, headers=tracing.inject({}))
            except httpx.TransportError as exc:  # refused, reset, timed out: a restart looks like this
                if last or not isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError)):
                    raise
                wait, why = retry_after(None, attempt), f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return response.json()
                if response.status_code not in RETRIED_STATUSES or last:
                    raise RemoteError(response.status_code, _detail(response), f"{self.url}{path}")
                wait, why = retry_after(response.headers.get("retry-after"), attempt), f"HTTP {response.status_code}"
                if wait > self.max_retry_wait:
                    asks = f"it asks to retry in {wait:.0f} s, more than max_retry_wait {self.max_retry_wait:g} s"
                    raise RemoteError(response.status_code, f"{_detail(response)} ({asks})", f"{self.url}{path}")
            retry = f"retry {attempt + 1} of {self.max_retries}"
            log.info("%s %s%s: %s; retrying in %.2f s (%s)", method, self.url, path, why, wait, retry)
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteClassifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

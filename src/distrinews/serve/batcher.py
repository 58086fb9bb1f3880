"""Async micro-batcher: coalesce concurrent requests into one forward pass.

Requests (each a list of texts) wait in a queue. One loop on the event loop takes a batch
(up to ``max_batch_size`` texts, waiting at most ``max_wait_ms`` for more to arrive) and
runs the prediction on a single worker thread, so the event loop keeps accepting and
parsing requests while the model computes. While a forward pass runs, new requests pile
up and form the next batch: under load, batches grow by themselves.

The wait window opens only when there is evidence of concurrency (the last batch held
more than one request, or this request arrived while the model was busy). A lone client
therefore never pays ``max_wait_ms`` for company that is not coming, and a crowd always
gets the full window to fill a batch.

The queue is bounded: ``submit`` raises :class:`QueueFullError` (HTTP 429) instead of
letting latency grow without limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFullError(RuntimeError):
    """The queue holds ``max_queue`` texts already: the caller should retry later (429)."""


class BatcherClosedError(RuntimeError):
    """The batcher is shutting down and takes no new work (503)."""


@dataclass
class _Request:
    texts: list[str]
    future: asyncio.Future
    enqueued: float
    arrived_busy: bool = field(default=False)


class MicroBatcher:
    """``await batcher.submit(texts)`` -> ``predict(texts)``'s results, computed in a shared batch.

    ``predict`` takes a list of texts and returns one result per text, in order; it runs on
    the batcher's own thread. ``on_batch(n_texts, n_requests, seconds)`` is called on the
    event loop after every forward pass (for metrics).
    """

    def __init__(
        self,
        predict: Callable[[list[str]], Sequence[Any]],
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        on_batch: Callable[[int, int, float], None] | None = None,
    ):
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1, max_wait_ms >= 0")
        self.predict = predict
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._pending: deque[_Request] = deque()
        self._queued_texts = 0
        self._busy = False
        self._last_batch_requests = 0
        self._closing = False
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        # One thread: PyTorch and ONNX Runtime already use every core inside one forward
        # pass; two concurrent passes would only fight over them.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distrinews-forward")

    # ------------------------------------------------------------------ state
    @property
    def queue_depth(self) -> int:
        """Texts waiting for a forward pass (not counting the one running)."""
        return self._queued_texts

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="distrinews-batcher")

    async def close(self) -> None:
        """Take no new work, finish everything already queued, then stop the worker thread."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # ------------------------------------------------------------------ producer side
    async def submit(self, texts: Sequence[str]) -> list[Any]:
        if self._closing or self._task is None:
            raise BatcherClosedError("the server is shutting down" if self._closing else "the batcher is not started")
        n = len(texts)
        # A request larger than the whole queue is still admitted when the queue is empty:
        # otherwise it could never be served at all.
        if self._queued_texts and self._queued_texts + n > self.max_queue:
            raise QueueFullError(f"server busy: {self._queued_texts} texts already queued (limit {self.max_queue}); retry shortly")
        loop = asyncio.get_running_loop()
        request = _Request(list(texts), loop.create_future(), loop.time(), arrived_busy=self._busy or bool(self._pending))
        self._pending.append(request)
        self._queued_texts += n
        assert self._wakeup is not None
        self._wakeup.set()
        return await request.future

    # ------------------------------------------------------------------ consumer side
    async def _wait_for_wakeup(self, timeout: float | None) -> bool:
        assert self._wakeup is not None
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _next_batch(self) -> list[_Request] | None:
        loop = asyncio.get_running_loop()
        while not self._pending:
            if self._closing:
                return None
            await self._wait_for_wakeup(None)
        first = self._pending[0]
        window = self.max_wait if (self._last_batch_requests > 1 or first.arrived_busy) else 0.0
        deadline = first.enqueued + window
        while self._queued_texts < self.max_batch_size and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._wait_for_wakeup(remaining):
                break
        # Take whole requests from the front while they fit; the first is always taken (a
        # request bigger than a batch is split into chunks by the predictor itself).
        batch = [self._pending.popleft()]
        n = len(first.texts)
        while self._pending and n + len(self._pending[0].texts) <= self.max_batch_size:
            request = self._pending.popleft()
            batch.append(request)
            n += len(request.texts)
        self._queued_texts -= n
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            texts = [t for request in batch for t in request.texts]
            self._busy = True
            start = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self.predict, texts)
                if len(results) != len(texts):
                    raise RuntimeError(f"predict returned {len(results)} results for {len(texts)} texts")
            except Exception as exc:  # the requests of this batch fail; the batcher lives on
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
            else:
                offset = 0
                for request in batch:
                    part = list(results[offset : offset + len(request.texts)])
                    offset += len(request.texts)
                    if not request.future.done():  # the caller may have given up (cancelled)
                        request.future.set_result(part)
            finally:
                self._busy = False
                self._last_batch_requests = len(batch)
            if self.on_batch is not None:
                self.on_batch(len(texts), len(batch), time.perf_counter() - start)

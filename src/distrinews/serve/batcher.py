"""Async micro-batcher: coalesce concurrent requests into one forward pass.

A request (a list of texts) is encoded on the **tokenizer thread** as soon as it arrives (``encode``; one of at most
``encode_inline_chars`` characters on the event loop instead, as a short text tokenizes faster than a thread hop),
so its length in tokens is known while earlier batches run; the **forward threads** run the batches, the next one
formed at once from the requests already tokenized when one frees. Neither waits for the other.

Forward passes run one at a time on ``forward`` (every core), except under concurrency when ``side_forward`` (the
same model on one core) is given: then up to ``lanes`` batches run side by side, one a core, since one pass on two
cores leaves one waiting through the pass's serial parts and while the event loop answers (benchmarks/serving.md).
A pass takes a lane when another is running or more is queued than it takes (what is queued is then shared between
the free lanes); a lone request, and a batch that takes everything with nothing else running, get every core.

A batch holds whole requests within ``max_batch_size`` texts and ``max_batch_tokens`` padded tokens, formed around
the oldest request from the queued ones nearest it in length; one over a limit runs as several forward passes
(``predict.batch_forming``; running and answering a batch: ``batch_runner``).

A batch waits for company only while company is known to be coming: a request being tokenized, or one the server
has begun to receive and not yet queued (``arrivals``). It starts once every request in flight is in it (or it is
full), and waits at most ``max_wait_ms`` past its oldest request's arrival: a lone client, or a closed loop of a few,
never pays the window, and a crowd whose requests are on their way gets it to fill a batch. A request cancelled
before its batch forms (its client went away) is never computed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..predict.batch_forming import take
from .arrivals import Arrivals
from .batch_runner import BatchRunner, ForwardStalledError, Stalled

TOKENIZER_THREAD = "distrinews-tokenize"
FORWARD_THREAD = "distrinews-forward"

log = logging.getLogger("distrinews.serve")


class QueueFullError(RuntimeError):
    """The queue holds ``max_queue`` texts already: the caller should retry later (429)."""


class BatcherClosedError(RuntimeError):
    """The batcher is shutting down and takes no new work (503)."""


@dataclass(eq=False)
class _Request:
    texts: list[str]
    future: asyncio.Future[list[Any]]
    enqueued: float
    arrived_busy: bool = False
    stage: str = "tokenizing"  # -> "ready" -> "running"; or "dropped" (its client went away first)
    items: list[Any] = field(default_factory=list)  # the encoded texts, once tokenized
    longest: int = 0  # tokens in its longest text
    tokenize_s: float = 0.0
    timing: dict[str, float] | None = None  # filled in for the caller once computed (enqueue's ``timing``)
    encode: Callable[[list[str]], Sequence[Any]] | None = None  # this request's own (enqueue's ``encode``)


@dataclass
class BatchStats:
    """What one forward job did, for metrics (``on_batch``)."""

    texts: int
    requests: int
    padded_tokens: int  # summed over the job's forward passes
    passes: int
    forward_s: float  # the forward thread's whole job: collate, model, softmax
    queue_s: list[float]  # per request: tokenized and waiting for the model
    tokenize_s: list[float]  # per request: on the tokenizer thread


class MicroBatcher:
    """``await batcher.submit(texts)`` -> ``forward(encode(texts))``'s results, computed in a shared batch.

    ``encode(texts)``: one item per text (``len(item)``: its tokens; without it, the texts and their characters).
    ``forward(items)``: one result per item, in order. ``on_batch(BatchStats)`` and ``on_dropped(requests)`` are
    called on the event loop."""

    def __init__(
        self,
        forward: Callable[[list[Any]], Sequence[Any]],
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        on_batch: Callable[[BatchStats], None] | None = None,
        *,
        encode: Callable[[list[str]], Sequence[Any]] | None = None,
        max_batch_tokens: int | None = None,
        on_dropped: Callable[[int], None] | None = None,
        forward_timeout: float | None = None,
        on_fatal: Callable[[str], None] | None = None,
        encode_inline_chars: int = 0,
        side_forward: Callable[[list[Any]], Sequence[Any]] | None = None,
        lanes: int = 1,
        arrivals: Arrivals | None = None,
    ):
        tokens_unlimited_or_positive = max_batch_tokens is None or max_batch_tokens >= 1
        if max_batch_size < 1 or max_queue < 1 or not tokens_unlimited_or_positive or max_wait_ms < 0:
            raise ValueError("max_batch_size, max_queue and max_batch_tokens must be >= 1, max_wait_ms >= 0")
        if forward_timeout is not None and forward_timeout <= 0:
            raise ValueError("forward_timeout must be > 0 seconds (None: no limit)")
        self.forward, self.side_forward, self.encode = forward, side_forward, encode
        self.max_batch_size, self.max_batch_tokens, self.max_queue = max_batch_size, max_batch_tokens, max_queue
        # How far past the oldest request a batch looks for texts of a similar length.
        self.lookahead = 4 * max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.on_batch, self.on_dropped, self.on_fatal = on_batch, on_dropped, on_fatal
        self.encode_inline_chars = encode_inline_chars
        self.lanes = lanes if side_forward is not None else 1
        # Requests on their way through the HTTP layer; each one that lands or leaves wakes the window.
        self.arrivals = arrivals if arrivals is not None else Arrivals()
        self.arrivals.on_change = self._wake
        self._passes: dict[asyncio.Task[None], list[_Request]] = {}  # the passes running, each with its batch
        self._wide = False  # the pass running is on ``forward`` (every core): nothing runs beside it
        self._died: str | None = None  # why the batching loop ended unasked
        self._ready: deque[_Request] = deque()  # tokenized, in arrival order
        self._tokenizing = 0  # requests on (or waiting for) the tokenizer thread
        self._queued_texts = 0  # texts not yet handed to the forward thread
        self._gone = 0  # cancelled requests possibly still in _ready
        self._last_batch_requests = 0
        self._batches = 0  # forward jobs started
        self._closing = False
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._tokenizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=TOKENIZER_THREAD)
        # A thread a lane: a pass on ``forward`` already uses every core, so it never has company.
        self._executor = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix=FORWARD_THREAD)
        self._runner = BatchRunner(self._executor, max_batch_size, max_batch_tokens, forward_timeout)

    # ------------------------------------------------------------------ state
    @property
    def queue_depth(self) -> int:
        """Texts waiting for a forward pass (being tokenized or tokenized; not the batch running)."""
        return self._queued_texts

    @property
    def stalled(self) -> str | None:
        """Why the model answers nothing now (a forward pass past its deadline), or None."""
        return self._runner.stalled

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="distrinews-batcher")
            self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """The loop returns only once closing; any other end leaves every request unanswered for good."""
        if not task.cancelled() and task.exception() is not None:
            self._die(task.exception())

    def _pass_ended(self, task: asyncio.Task[None]) -> None:
        """A pass's task is done: its lane is free; a pass that raised (not its forward: that is caught) is fatal."""
        if not task.cancelled() and task.exception() is not None and self._died is None:
            self._die(task.exception())  # its batch is still in _passes: answered with the reason
            if self._task is not None:
                self._task.cancel()
        self._passes.pop(task, None)
        self._wide = False
        self._wake()

    def _die(self, exc: BaseException | None) -> None:
        reason = self._died = f"the batching loop died ({type(exc).__name__})"
        log.critical("%s; no request can be answered any more", reason, exc_info=exc)
        self._closing = True  # new requests get BatcherClosedError (503) from here on
        self._fail_queued(BatcherClosedError(reason))
        for request in itertools.chain.from_iterable(self._passes.values()):
            if not request.future.done():
                request.future.set_exception(BatcherClosedError(reason))
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _fail_queued(self, exc: Exception) -> None:
        """Fail every request waiting for the model (tokenized or not) with ``exc``."""
        for request in self._ready:
            if request.stage == "ready" and not request.future.done():
                request.stage = "dropped"
                self._queued_texts -= len(request.texts)
                request.future.set_exception(exc)
        self._ready.clear()
        self._gone = 0

    async def close(self) -> None:
        """Take no new work, finish everything already queued, then stop the worker threads."""
        self._closing = True
        self._wake()
        if self.stalled is not None and self._task is not None:  # the stuck pass may never return: do not wait for it
            self._task.cancel()
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._task is not None:
            await asyncio.wait([self._task])  # how it ended was logged by _loop_ended
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._tokenizer.shutdown)
        if self.stalled is None:
            await loop.run_in_executor(None, self._executor.shutdown)

    # ------------------------------------------------------------------ producer side
    def enqueue(
        self,
        texts: Sequence[str],
        timing: dict[str, float] | None = None,
        encode: Callable[[list[str]], Sequence[Any]] | None = None,
    ) -> asyncio.Future[list[Any]]:
        """Queue ``texts``; the future resolves to their results (cancel it to withdraw the request). Raises
        QueueFullError when the queue is full, BatcherClosedError when shutting down.

        ``encode`` tokenizes this request's texts instead of the batcher's (TEI's truncation), once it is admitted;
        what it raises is the request's error. ``timing`` is filled in before the future resolves: ``tokenize_s``,
        ``queue_s``, ``inference_s``, ``tokens`` (unpadded), and of its forward job ``done`` (its end, on
        ``time.perf_counter``'s clock), ``batch`` (from 1), ``batch_texts``, ``batch_requests``, ``padded_tokens``
        and ``passes``."""
        self.arrivals.landed()  # queued, or turned away: either way no longer on its way
        if self._closing or self._task is None:
            raise BatcherClosedError("the server is shutting down" if self._closing else "the batcher is not started")
        if (stalled := self.stalled) is not None:
            raise ForwardStalledError(stalled)
        n = len(texts)
        # A request larger than the whole queue is still admitted when the queue is empty, or it could never be served.
        if self._queued_texts and self._queued_texts + n > self.max_queue:
            raise QueueFullError(
                f"server busy: {self._queued_texts} texts already queued (limit {self.max_queue}); retry shortly"
            )
        loop = asyncio.get_running_loop()
        busy = bool(self._passes) or bool(self._ready) or self._tokenizing > 0
        request = _Request(
            list(texts), loop.create_future(), loop.time(), arrived_busy=busy, timing=timing, encode=encode
        )
        request.future.add_done_callback(lambda future: self._on_done(request))
        self._queued_texts += n
        self._tokenizing += 1
        if (request.encode or self.encode) is None or sum(map(len, request.texts)) <= self.encode_inline_chars:
            # Short texts tokenize in less time than a hop to the tokenizer thread and back takes: here, at once.
            job = loop.create_future()
            try:
                job.set_result(self._encode_job(request))
            except Exception as exc:
                job.set_exception(exc)
            self._on_encoded(request, job)
        else:
            job = loop.run_in_executor(self._tokenizer, self._encode_job, request)
            job.add_done_callback(lambda done: self._on_encoded(request, done))
        return request.future

    async def submit(self, texts: Sequence[str]) -> list[Any]:
        return await self.enqueue(texts)

    def _encode_job(self, request: _Request) -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        if (encode := request.encode or self.encode) is None:  # the texts are the items, their characters the length
            return request.texts, 0.0
        items = list(encode(request.texts))
        return items, time.perf_counter() - t0

    def _on_encoded(self, request: _Request, job: asyncio.Future[tuple[list[Any], float]]) -> None:
        """The request's texts are tokenized (``job``'s result: the items and the seconds it took), or failed to be."""
        self._tokenizing -= 1
        error = RuntimeError("tokenization was cancelled") if job.cancelled() else job.exception()
        if request.stage == "dropped":  # the client went away while its texts were tokenized
            return self._wake()
        if error is None:
            request.items, request.tokenize_s = job.result()
            if len(request.items) != len(request.texts):
                error = RuntimeError(f"encode returned {len(request.items)} items for {len(request.texts)} texts")
        if (stalled := self.stalled) is not None:
            error = ForwardStalledError(stalled)
        elif self._died is not None:
            error = BatcherClosedError(self._died)
        if error is not None:
            self._queued_texts -= len(request.texts)
            request.future.set_exception(error)
        else:
            request.longest = max((len(item) for item in request.items), default=0)
            request.stage = "ready"
            self._ready.append(request)
        self._wake()

    def _on_done(self, request: _Request) -> None:
        """A future cancelled before its batch ran: the request leaves the queue now and is never computed."""
        if not request.future.cancelled() or request.stage not in ("tokenizing", "ready"):
            return
        if request.stage == "ready":
            self._gone += 1  # still in _ready: _drop_gone takes it out before the next batch forms
        request.stage = "dropped"
        self._queued_texts -= len(request.texts)
        if self.on_dropped is not None:
            self.on_dropped(1)
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # ------------------------------------------------------------------ consumer side
    async def _wait_for_wakeup(self, timeout: float | None) -> bool:
        assert self._wakeup is not None
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)  # None: no timeout, the wait itself
        except asyncio.TimeoutError:
            return False
        return True

    def _drop_gone(self) -> None:
        """Take the requests whose client went away out of the queue: they are never computed."""
        for request in self._ready:  # cancelled, but its done-callback has not run yet
            if request.stage == "ready" and request.future.cancelled():
                self._on_done(request)
        if self._gone:
            self._ready = deque(request for request in self._ready if request.stage != "dropped")
            self._gone = 0

    def _take(self, cap: int | None = None) -> tuple[list[_Request], bool]:
        """The next batch (``batch_forming.take``: at most ``cap`` texts, if given), and whether it is full."""
        limit = min(cap or self.max_batch_size, self.max_batch_size)
        return take(list(itertools.islice(self._ready, self.lookahead)), limit, self.max_batch_tokens, len(self._ready))

    def _cap(self) -> int | None:
        """The most texts the next batch may take: with several lanes free under concurrency (the last batch shared,
        or the oldest request arrived while the model was busy), what is queued is shared between them."""
        free = self.lanes - len(self._passes)
        if free < 2 or not (self._last_batch_requests > 1 or self._ready[0].arrived_busy):
            return None
        ready = sum(len(r.items) for r in self._ready)
        return max(1, -(-ready // free))

    async def _next_batch(self) -> list[_Request] | None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_gone()
            if not self._ready:
                if self._closing and not self._tokenizing:
                    return None
                await self._wait_for_wakeup(None)
                continue
            deadline = self._ready[0].enqueued + self.max_wait
            # the window stays open only while more is known to be on its way: tokenizing, or received, not queued
            while not self._closing and (self._tokenizing > 0 or self.arrivals.pending > 0) and not self._take()[1]:
                remaining = deadline - loop.time()
                if remaining <= 0 or not await self._wait_for_wakeup(remaining):
                    break
                self._drop_gone()
                if not self._ready:
                    break
            self._drop_gone()  # the last look: a client that left during the window is not computed
            if not self._ready:
                continue
            batch, _ = self._take(self._cap())
            for request in batch:
                request.stage = "running"
            if len(batch) == len(self._ready):
                self._ready.clear()
            else:
                self._ready = deque(request for request in self._ready if request.stage != "running")
            self._queued_texts -= sum(len(r.texts) for r in batch)
            return batch

    async def _loop(self) -> None:
        try:
            while True:
                # Nothing runs beside a pass on every core, nor after a pass stuck; a pass ending wakes the wait.
                while self._passes and (self._wide or len(self._passes) >= self.lanes or self.stalled is not None):
                    await self._wait_for_wakeup(None)
                batch = await self._next_batch()
                if batch is None:
                    if self._passes:
                        await asyncio.wait(list(self._passes))
                    return
                # Beside another pass, or with more queued to start beside it: a lane of one core; else every core.
                side = self.side_forward is not None and (bool(self._passes) or bool(self._ready))
                forward = self.side_forward if side and self.side_forward is not None else self.forward
                self._wide = forward is self.forward
                self._batches += 1
                task = asyncio.get_running_loop().create_task(self._pass(batch, forward, self._batches))
                self._passes[task] = batch
                task.add_done_callback(self._pass_ended)
        except asyncio.CancelledError:
            for task in list(self._passes):
                task.cancel()
            raise

    async def _pass(self, batch: list[_Request], forward: Callable[[list[Any]], Sequence[Any]], number: int) -> None:
        """One batch on ``forward``: answered, its stall waited out, its stats reported (a task, beside the loop)."""
        start, now = time.perf_counter(), asyncio.get_running_loop().time()
        queue_s = [now - request.enqueued - request.tokenize_s for request in batch]
        tokens = passes = 0
        try:
            tokens, passes = await self._runner.run(batch, queue_s, forward, number)
        except Stalled as stalled:
            self._fail_queued(ForwardStalledError(self.stalled))
            await self._runner.wait_out(stalled, batch)
        finally:
            self._last_batch_requests = len(batch)
        if self.on_batch is not None:
            stats = BatchStats(
                texts=sum(len(request.items) for request in batch),
                requests=len(batch),
                padded_tokens=tokens,
                passes=passes,
                forward_s=time.perf_counter() - start,
                queue_s=queue_s,
                tokenize_s=[request.tokenize_s for request in batch],
            )
            try:
                self.on_batch(stats)
            except Exception:  # a metric is not worth the requests behind it
                log.exception("on_batch failed; the batch's requests were answered")

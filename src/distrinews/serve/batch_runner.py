"""A batch the micro-batcher formed, run on a forward thread and answered (``BatchRunner.run``): one forward pass, or
several where it is over a limit (``predict.batch_forming.run_passes``), each request given its results and timing.

Faults stay with the request that caused them, and a stuck model is seen:

- a forward pass that raises is retried one request at a time, so only the requests whose own texts fail get
  :class:`ForwardError`;
- a pass past ``forward_timeout`` raises :class:`Stalled` to the batcher, which fails its requests and every queued
  one with :class:`ForwardStalledError` and refuses new ones (``stalled`` says why) until every stuck pass returns
  (``wait_out``): a thread cannot be stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from ..predict.batch_forming import run_passes

log = logging.getLogger("distrinews.serve")

Forward = Callable[[list[Any]], Sequence[Any]]


class ForwardError(RuntimeError):
    """The forward pass failed on this request's own texts (the cause is chained and logged, never shown)."""


class ForwardStalledError(RuntimeError):
    """A forward pass has run past ``forward_timeout``: the model is stuck (503)."""


class Answerable(Protocol):
    """What the runner reads of a queued request, and answers."""

    texts: list[str]
    items: list[Any]  # its encoded texts
    future: asyncio.Future[Any]
    tokenize_s: float
    timing: dict[str, float] | None  # filled in before the future resolves, where the caller asked


class Stalled(Exception):
    """A forward pass overran its deadline; ``job`` is the pass still running."""

    def __init__(self, job: asyncio.Future[Any]):
        super().__init__("forward pass stalled")
        self.job = job
        self.requests: list[Answerable] | None = None  # the requests still unanswered, where a retry stalled


class BatchRunner:
    """Runs batches on ``executor`` (the forward threads), each pass within ``max_texts`` texts and ``max_tokens``
    padded tokens and its job within ``forward_timeout`` seconds (None: no limit)."""

    def __init__(self, executor: Executor, max_texts: int, max_tokens: int | None, forward_timeout: float | None):
        self.executor, self.max_texts, self.max_tokens = executor, max_texts, max_tokens
        self.forward_timeout = forward_timeout
        self._stalled_since: float | None = None  # perf_counter() when a running forward pass overran its deadline
        self._stuck = 0  # passes past their deadline that have not returned

    @property
    def stalled(self) -> str | None:
        """Why the model answers nothing now (a forward pass past its deadline), or None."""
        if self._stalled_since is None:
            return None
        running = self.forward_timeout + time.perf_counter() - self._stalled_since  # type: ignore[operator]
        return (
            f"the model is stuck: a forward pass has run for {running:.0f}s "
            f"(the server's --forward-timeout is {self.forward_timeout:g}s)"
        )

    def _forward_job(self, forward: Forward, items: list[Any]) -> tuple[list[Any], int, int]:
        """On a forward thread: the batch as one forward pass, or several if it exceeds a limit."""
        return run_passes(forward, items, self.max_texts, self.max_tokens)

    async def _run_forward(self, forward: Forward, items: list[Any]) -> tuple[list[Any], int, int]:
        """``_forward_job`` on a forward thread: (results, padded tokens, passes). Past ``forward_timeout`` the model
        counts as stuck: ``Stalled`` is raised at once, and the pass's result, when it returns, is dropped."""
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self.executor, self._forward_job, forward, items)
        done, _ = await asyncio.wait([job], timeout=self.forward_timeout)
        if done:
            results, tokens, passes = job.result()
            if len(results) != len(items):
                raise RuntimeError(f"forward returned {len(results)} results for {len(items)} texts")
            return results, tokens, passes
        self._stuck += 1
        if self._stalled_since is None:
            self._stalled_since = time.perf_counter()
        log.error("%s; /ready answers 503 until it returns", self.stalled)
        raise Stalled(job)

    async def run(
        self, batch: Sequence[Answerable], queue_s: list[float], forward: Forward, number: int
    ) -> tuple[int, int]:
        """Answer every request of ``batch`` (``queue_s``: each one's wait in the queue; ``number``: the batch's,
        from 1); (padded tokens, passes) of the forward passes run. Raises ``Stalled`` past the deadline."""
        items = [item for request in batch for item in request.items]
        start = time.perf_counter()
        timed = _Timing(start, number, dict(zip(map(id, batch), queue_s)))
        try:
            results, tokens, passes = await self._run_forward(forward, items)
        except Stalled:
            raise
        except Exception as exc:
            if len(batch) == 1:
                self._fail(batch[0], exc)
                return 0, 1
            return await self._each_alone(batch, forward, timed)
        offset = 0
        job = {"batch_texts": len(items), "batch_requests": len(batch), "padded_tokens": tokens, "passes": passes}
        for request in batch:
            part = results[offset : offset + len(request.items)]
            offset += len(request.items)
            if not request.future.done():  # the caller may have given up meanwhile
                timed.answer(request, part, job)
        return tokens, passes

    async def _each_alone(self, batch: Sequence[Answerable], forward: Forward, timed: _Timing) -> tuple[int, int]:
        """After a failed batch: each request alone, so that only one whose texts broke the pass fails."""
        tokens = passes = 0
        for request in batch:
            if request.future.done():
                continue
            try:
                part, part_tokens, part_passes = await self._run_forward(forward, request.items)
            except Stalled as stalled:
                stalled.requests = [r for r in batch if not r.future.done()]
                raise
            except Exception as retry_exc:
                self._fail(request, retry_exc)
            else:
                tokens, passes = tokens + part_tokens, passes + part_passes
                alone = {"batch_texts": len(request.items), "batch_requests": 1, "padded_tokens": part_tokens}
                timed.answer(request, part, {**alone, "passes": part_passes})
        return tokens, passes + 1

    def _fail(self, request: Answerable, exc: Exception) -> None:
        log.error("the forward pass failed on a request of %d texts", len(request.texts), exc_info=exc)
        if not request.future.done():
            error = ForwardError("the model failed on this request's texts")
            error.__cause__ = exc
            request.future.set_exception(error)

    async def wait_out(self, stalled: Stalled, batch: Sequence[Answerable]) -> None:
        """Fail the stuck pass's requests now; return once the pass has (new work waits until then)."""
        for request in stalled.requests if stalled.requests is not None else batch:
            if not request.future.done():
                request.future.set_exception(ForwardStalledError(self.stalled))
        await asyncio.wait([stalled.job])
        took = self.forward_timeout + time.perf_counter() - self._stalled_since  # type: ignore[operator]
        self._stuck -= 1
        if self._stuck:
            log.warning("a stuck forward pass returned after %.0fs; %d still running", took, self._stuck)
            return
        log.warning("the stuck forward pass returned after %.0fs; serving again", took)
        self._stalled_since = None


@dataclass
class _Timing:
    """Fills in a request's timing (where it asked) as it is answered: ``start`` (on ``time.perf_counter``'s clock)
    and ``number`` of its batch, ``waited``: each request's wait in the queue, by ``id``."""

    start: float
    number: int
    waited: dict[int, float]

    def answer(self, request: Answerable, part: list[Any], job: Mapping[str, float]) -> None:
        """``job``: the forward job that computed it (the batch, or the request alone after a failed batch)."""
        if request.timing is not None:
            done = time.perf_counter()
            mine = {
                "tokenize_s": request.tokenize_s,
                "queue_s": self.waited[id(request)],
                "inference_s": done - self.start,
                "tokens": sum(len(item) for item in request.items),
            }
            request.timing.update(job, done=done, batch=self.number, **mine)
        request.future.set_result(part)

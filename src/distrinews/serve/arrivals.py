"""The requests the server has begun to receive and not yet queued: the work the batching window waits for.

``ArrivalsMiddleware`` counts a POST from its first ASGI call until it reaches the batcher's queue (``landed``,
called by ``enqueue``) or, if it never does (a 401, 413, 422 or 429), until it is answered. Each change wakes the
batcher (``on_change``), so a window waiting for a request that was turned away closes at once. Which request
landed is told by a context variable: the middleware and the route run in one ASGI call (a task the route starts
copies the context, and the cell with it).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

_ARRIVING: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("distrinews_arriving", default=None)


class Arrivals:
    """How many requests are on their way to the batcher's queue (``pending``)."""

    def __init__(self) -> None:
        self.pending = 0
        self.on_change: Callable[[], None] | None = None  # the batcher's wake-up, once it runs

    def landed(self) -> None:
        """The request of the current context reached the queue: it stops counting (once; outside one, nothing)."""
        cell = _ARRIVING.get()
        if cell is not None and cell[0]:
            self.settle(cell)

    def settle(self, cell: list[bool]) -> None:
        """The request of ``cell`` stops counting."""
        cell[0] = False
        self.pending -= 1
        if self.on_change is not None:
            self.on_change()


class ArrivalsMiddleware:
    """Count each POST to ``paths`` in ``arrivals`` from its first ASGI call until it is queued or answered."""

    def __init__(self, app: ASGIApp, arrivals: Arrivals, paths: tuple[str, ...]):
        self.app, self.arrivals, self.paths = app, arrivals, frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        cell = [True]
        self.arrivals.pending += 1
        token = _ARRIVING.set(cell)
        try:
            await self.app(scope, receive, send)
        finally:
            _ARRIVING.reset(token)
            if cell[0]:
                self.arrivals.settle(cell)

"""Slow clients: a deadline for a request's headers, and a cap on open connections; each answer in one write.

uvicorn's h11 protocol waits for a request's headers as long as the client keeps the connection
open (its keep-alive timeout ends with the first byte received), so a client that sends half
the headers and stops holds a connection and a file descriptor forever; uvicorn's
``limit_concurrency`` answers 503 only once a request's headers are complete, so such clients
are not counted against it either. ``GuardedH11Protocol`` adds the two missing pieces:

- ``header_timeout``: from the moment a connection opens, and again from each answer sent on it
  (keep-alive), the client has that many seconds to complete the next request's headers;
  otherwise the connection is closed (nginx's ``client_header_timeout``). A request whose
  headers arrived is never cut by it: reading the body and computing the answer are bounded
  elsewhere (the body limit, the queue).
- ``max_connections``: a connection beyond the cap is answered ``503`` with a JSON body and
  ``Retry-After: 1`` before anything is read, and closed.
- One write per answer: uvicorn writes an answer's status line and headers, then its body, in two
  writes. A replica killed between them leaves nginx holding headers with no body, which nginx
  has already passed on, so it cannot retry the request elsewhere and its client gets a truncated
  answer. ``OneWritePerStep`` sends what one step of the event loop wrote as one write, so a kill
  comes before an answer (nginx retries it on another replica) or after it (the kernel delivers it).

The class is built per server (``guarded_protocol``), as uvicorn instantiates the protocol class
itself with its own arguments.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("distrinews.serve")


class OneWritePerStep:
    """A transport whose writes made in one step of the event loop leave as one write, at the end of that
    step (or at ``close``, first). Everything else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, chunks) -> None:  # defined here, or it would reach the wrapped transport ahead of what is pending
        self.write(b"".join(chunks))

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _refusal(max_connections: int) -> bytes:
    detail = f"too many open connections (the server's --max-connections is {max_connections}); retry shortly"
    body = json.dumps({"detail": detail}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(header_timeout: float | None, max_connections: int | None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline and a connection cap (None: that one is off), writing
    each answer in one write."""
    refusal = _refusal(max_connections) if max_connections else b""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(OneWritePerStep(transport, self.loop))  # type: ignore[arg-type]
            if max_connections and len(self.connections) > max_connections:
                log.warning("refused a connection: %d open, --max-connections is %d", len(self.connections) - 1, max_connections)
                transport.write(refusal)
                transport.close()
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers are complete: it is no longer a slow client
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            # Armed first: the call below may start a pipelined request at once, which disarms it.
            if not self.transport.is_closing():
                self._arm_header_timer()
            super().on_response_complete()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            if header_timeout:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_too_late)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_late(self) -> None:
            self._header_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered (a pipelined one started since the timer was armed)
            if not self.transport.is_closing():
                log.info("closed a connection from %s: no complete request headers in %gs (--header-timeout)", self.client, header_timeout)
                self.transport.close()

    return GuardedH11Protocol

"""Slow clients: deadlines for a request's headers and body, and a cap on open connections; each answer in one write.

uvicorn's h11 protocol waits for a request's headers as long as the client keeps the connection open (its
keep-alive timeout ends with the first byte received), and its ``limit_concurrency`` counts a request only once its
headers are complete: a client that sends half the headers and stops holds a connection forever, uncounted.
``GuardedH11Protocol`` adds:

- ``header_timeout``: from a connection's opening, and again from each answer sent on it, the client has that long
  to complete the next request's headers, or the connection is closed (nginx's ``client_header_timeout``);
- ``body_timeout``: from the end of its headers, the client has that long to send the whole body, read or not (after
  a 401 or 405), or it is answered ``408`` (if nothing was answered yet) and closed;
- ``send_timeout``: an answer the client does not read waits in asyncio's write buffer, and closing the connection
  waits for that buffer to drain, forever if the client never reads. Once the kernel takes no byte of it for that
  long, the connection is aborted and its buffer dropped (nginx's ``send_timeout``: between two writes);
- ``max_connections``: a connection beyond the cap is answered ``503`` (JSON, ``Retry-After: 1``) unread and closed;
- one write per answer: uvicorn writes the status line and headers, then the body. A replica killed between the two
  leaves nginx holding headers it has already passed on, so it cannot retry elsewhere and its client gets a
  truncated answer. ``OneWritePerStep`` sends what one step of the event loop wrote as one write, so a kill comes
  before an answer (nginx retries it) or after it (the kernel delivers it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .middleware import PROTOCOL_STATUS

log = logging.getLogger("distrinews.serve")


class OneWritePerStep:
    """A transport whose writes made in one step of the event loop leave as one write, at the end of that step (or at
    ``close``, first). Everything else is the wrapped transport's."""

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, on_write: Callable[[], None] | None = None
    ):
        self._transport, self._loop, self._on_write = transport, loop, on_write
        self._pending: list[bytes] = []
        self.written = 0  # bytes handed to the wrapped transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    # Defined here, or it would reach the wrapped transport ahead of what is pending.
    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(chunks))

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)
                self.written += len(data)
                if self._on_write is not None:
                    self._on_write()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _raw_answer(status: str, detail: str, *headers: str) -> bytes:
    """A whole JSON answer ``{"detail"}`` after which the connection closes, written before (or instead of) h11's."""
    body = json.dumps({"detail": detail}).encode()
    head = [f"HTTP/1.1 {status}", "content-type: application/json", *headers, "connection: close"]
    return "\r\n".join([*head, f"content-length: {len(body)}", "", ""]).encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap of the class attributes below (None: that one is
    off); ``guarded_protocol`` sets them in a subclass per server, as uvicorn instantiates the class itself."""

    header_timeout: float | None = None
    body_timeout: float | None = None
    send_timeout: float | None = None
    max_connections: int | None = None
    refusal = b""  # the 503 answer to a connection over ``max_connections``
    too_late = b""  # the 408 answer to a body slower than ``body_timeout``

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timers: dict[str, asyncio.TimerHandle] = {}  # "header", "body", "send": the deadlines armed
        self._socket_transport = transport
        self._writes = OneWritePerStep(transport, self.loop, self._watch_send if self.send_timeout else None)
        super().connection_made(self._writes)  # type: ignore[arg-type]
        if self.max_connections and len(self.connections) > self.max_connections:
            log.warning(
                "refused a connection: %d open, --max-connections is %d",
                len(self.connections) - 1,
                self.max_connections,
            )
            transport.write(self.refusal)
            transport.close()
            return
        self._arm("header", self.header_timeout, self._headers_too_late)

    def connection_lost(self, exc: Exception | None) -> None:
        for name in list(self._timers):
            self._disarm(name)
        super().connection_lost(exc)

    def _arm(self, name: str, seconds: float | None, callback: Callable[..., None], *args: Any) -> None:
        """(Re)start the deadline ``name``: ``callback(*args)`` in ``seconds`` (None or 0: that deadline is off)."""
        self._disarm(name)
        if seconds:
            self._timers[name] = self.loop.call_later(seconds, callback, *args)

    def _disarm(self, name: str) -> None:
        if (timer := self._timers.pop(name, None)) is not None:
            timer.cancel()

    def _sent(self) -> int:
        """Bytes of this connection's answers the kernel has taken (what is not in asyncio's buffer)."""
        return self._writes.written - self._socket_transport.get_write_buffer_size()

    def _watch_send(self) -> None:
        """After a write: if some of it waits in this process, the client has ``send_timeout`` to read."""
        if "send" not in self._timers and self._socket_transport.get_write_buffer_size():
            self._arm("send", self.send_timeout, self._send_too_late, self._sent())

    def _send_too_late(self, sent_before: int) -> None:
        self._timers.pop("send", None)
        if not self._socket_transport.get_write_buffer_size():
            return  # all sent
        if self._sent() > sent_before:  # the client reads, slowly: another send_timeout for the rest
            self._watch_send()
            return
        log.info(
            "aborted a connection from %s: %d bytes of answers unread for %gs (--send-timeout)",
            self.client,
            self._socket_transport.get_write_buffer_size(),
            self.send_timeout,
        )
        self._socket_transport.abort()  # the buffer is dropped; close() would wait for it to drain

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are complete: it is no longer a slow client
            self._disarm("header")
            if self.conn.their_state is h11.SEND_BODY:
                self._arm("body", self.body_timeout, self._body_too_late)
        if self.conn.their_state is not h11.SEND_BODY:  # the body is in (or there was none)
            self._disarm("body")

    def _body_too_late(self) -> None:
        self._timers.pop("body", None)
        if self.transport.is_closing():
            return
        log.info(
            "closed a connection from %s: no complete request body in %gs (--body-timeout)",
            self.client,
            self.body_timeout,
        )
        if self.cycle is not None and not self.cycle.response_started:
            # an extension key: uvicorn's TypedDict of the scope lists only the standard ones
            cast("dict[str, Any]", self.cycle.scope)[PROTOCOL_STATUS] = 408
            self.cycle.response_started = True  # the app's answer, if it still comes, is not written after ours
            self.transport.write(self.too_late)
        self.transport.close()

    def on_response_complete(self) -> None:
        # Armed first: the call below may start a pipelined request at once, which disarms it.
        if not self.transport.is_closing():
            self._arm("header", self.header_timeout, self._headers_too_late)
        super().on_response_complete()

    def _headers_too_late(self) -> None:
        self._timers.pop("header", None)
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered (a pipelined one started since the timer was armed)
        if not self.transport.is_closing():
            log.info(
                "closed a connection from %s: no complete request headers in %gs (--header-timeout)",
                self.client,
                self.header_timeout,
            )
            self.transport.close()


def guarded_protocol(
    header_timeout: float | None,
    max_connections: int | None,
    body_timeout: float | None = None,
    send_timeout: float | None = None,
) -> type[H11Protocol]:
    """uvicorn's h11 protocol with header, body and send deadlines and a connection cap (None: that one is off)."""
    settings = {
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "send_timeout": send_timeout,
        "max_connections": max_connections,
        "refusal": _raw_answer(
            "503 Service Unavailable",
            f"too many open connections (the server's --max-connections is {max_connections}); retry shortly",
            "retry-after: 1",
        ),
        "too_late": _raw_answer(
            "408 Request Timeout",
            f"the request body did not arrive within {body_timeout:g}s of its headers (the server's --body-timeout)",
        )
        if body_timeout
        else b"",
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), settings)

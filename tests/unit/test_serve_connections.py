"""The connection protocol ``distrinews serve`` runs (uvicorn's h11 with our guards), driven in process
over a recording transport: what reaches the socket, in which writes.

A replica killed between two writes of one answer leaves nginx holding a status line and headers
with no body; nginx has already passed them to the client, so it cannot retry the request on
another replica and the client gets a truncated answer (seen in CI as ``IncompleteRead(0 bytes
read, 203 more expected)`` under ``test_sigkill_to_a_replica_under_load_fails_no_request``).
An answer must therefore leave in one write: then a kill either comes before it (nothing
reached nginx, which retries elsewhere) or after it (the whole answer is in the kernel's
buffer and is delivered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from importlib.metadata import version
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from conftest import TOML, await_until, require, wait_until
from distrinews.serve.connections import guarded_protocol

BODY = b'{"label":"Business","probabilities":{"World":0.1,"Sports":0.1,"Business":0.7,"Sci/Tech":0.1}}'


class Recording(asyncio.Transport):
    """A socket transport that records each write (an empty one is no write, as asyncio's) and the close."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[bytes | str] = []
        self.closing = False

    def write(self, data) -> None:
        if data:
            assert not self.closing, "a write after close"
            self.events.append(bytes(data))

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.events.append("close")

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _app() -> Starlette:
    async def predict(request):
        await request.body()
        await asyncio.sleep(0.01)  # the answer is computed in another step of the loop, as the batcher's is
        return Response(BODY, media_type="application/json", headers={"x-model-version": "1.0.0"})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"])])


def _serve(requests: bytes, answers: int) -> list[bytes | str]:
    """Feed ``requests`` to one connection; the transport's events once ``answers`` answers have left."""

    async def main() -> list[bytes | str]:
        config = Config(_app(), log_level="warning", access_log=False)
        config.load()
        state = ServerState()
        protocol = guarded_protocol(header_timeout=5.0, max_connections=10)(
            config=config, server_state=state, app_state={}
        )
        transport = Recording()
        protocol.connection_made(transport)
        protocol.data_received(requests)

        def answered() -> bool:  # every answer sent, and the app's tasks for them all ended
            sent = b"".join(e for e in transport.events if isinstance(e, bytes))
            return sent.count(BODY) >= answers and not state.tasks

        await await_until(answered, 30, f"{answers} answers")
        for _ in range(5):  # what those last steps left for the end of a step (a write, the close) leaves now
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport.events

    return asyncio.run(main())


TEXT = b'{"text": "Oil prices jump"}'
REQUEST = b"POST /predict HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(TEXT),
    TEXT,
)


def test_an_answer_leaves_in_one_write():
    events = _serve(REQUEST, answers=1)
    writes = [e for e in events if isinstance(e, bytes)]
    assert len(writes) == 1, f"the answer left in {len(writes)} writes: {writes}"
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\n" + BODY)


def test_keep_alive_answers_each_leave_in_one_write():
    events = _serve(REQUEST * 3, answers=3)  # pipelined on one connection
    writes = [e for e in events if isinstance(e, bytes)]
    assert len(writes) == 3 and all(w.startswith(b"HTTP/1.1 200 ") and w.endswith(BODY) for w in writes), writes


def test_an_answer_then_close_writes_before_it_closes():
    close = REQUEST.replace(b"Host: a\r\n", b"Host: a\r\nConnection: close\r\n")
    events = _serve(close, answers=1)
    assert len(events) == 2 and isinstance(events[0], bytes) and events[0].endswith(BODY) and events[1] == "close", (
        events
    )


def test_writelines_joins_the_pending_write_in_order():
    """Not one of uvicorn's calls today, but one that reached the wrapped transport directly would overtake what
    waits."""
    from distrinews.serve.connections import OneWritePerStep

    async def main() -> list[bytes | str]:
        transport = Recording()
        wrapped = OneWritePerStep(transport, asyncio.get_running_loop())
        wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")
        wrapped.writelines([b"a", b"b"])
        assert transport.events == []  # nothing before the step ends
        await asyncio.sleep(0)
        return transport.events

    assert asyncio.run(main()) == [b"HTTP/1.1 200 OK\r\n\r\nab"]


def test_a_body_that_does_not_arrive_in_time_is_answered_408_then_closed():
    async def main() -> list[bytes | str]:
        config = Config(_app(), log_level="warning", access_log=False)
        config.load()
        protocol_class = guarded_protocol(header_timeout=5.0, max_connections=10, body_timeout=0.2)
        protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
        transport = Recording()
        protocol.connection_made(transport)
        protocol.data_received(
            REQUEST.replace(b"Content-Length: %d" % len(TEXT), b"Content-Length: 1000")
        )  # 973 bytes short
        await await_until(lambda: transport.closing, 30, "the connection closed")
        protocol.connection_lost(None)
        return transport.events

    events = asyncio.run(main())
    assert len(events) == 2 and events[1] == "close", events
    assert events[0].startswith(b"HTTP/1.1 408 ") and b"--body-timeout" in events[0], events


def test_uvicorn_is_within_the_range_its_internals_were_checked_in():
    """connections.py overrides methods of uvicorn's H11Protocol and reads its attributes, which are no API:
    pyproject.toml's serve extra bounds uvicorn above, deploy/requirements.txt (the image) pins a version within it, the
    installed uvicorn is within it, and what is overridden and read is uvicorn's own (the tests above drive it)."""
    tomllib = require(TOML)
    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    (declared,) = [r for r in map(Requirement, project) if r.name == "uvicorn"]
    lines = [line.split("#")[0].strip() for line in (root / "deploy" / "requirements.txt").read_text().splitlines()]
    (image,) = [r for r in map(Requirement, filter(None, lines)) if r.name == "uvicorn"]
    (pinned,) = image.specifier
    assert pinned.operator == "==" and declared.specifier.contains(pinned.version), (
        f"the image installs uvicorn{image.specifier}, outside the range the package declares"
    )
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in declared.specifier), (
        f"uvicorn{declared.specifier}: no upper bound"
    )
    assert declared.specifier.contains(version("uvicorn")), (
        f"uvicorn {version('uvicorn')} is outside {declared.specifier}"
    )
    overridden = {"connection_made", "connection_lost", "handle_events", "on_response_complete"}
    assert overridden <= set(vars(H11Protocol)), overridden - set(vars(H11Protocol))

    async def attributes() -> set[str]:
        config = Config(_app(), log_level="warning", access_log=False)
        config.load()
        protocol = H11Protocol(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(Recording())
        return {name for name in ("loop", "connections", "cycle", "transport", "client") if hasattr(protocol, name)}

    assert asyncio.run(attributes()) == {"loop", "connections", "cycle", "transport", "client"}


BIG = 1024 * 1024  # an answer far larger than the socket buffers the test shrinks below


def _big_answer_app() -> Starlette:
    async def big(request):
        return Response(b"x" * BIG, media_type="application/octet-stream")

    return Starlette(routes=[Route("/big", big)])


@contextlib.contextmanager
def _served_on_a_socket(app, **guards):
    """``app`` under uvicorn with ``guarded_protocol(**guards)`` in a thread, and a client socket connected to it;
    both sides' socket buffers shrunk to a few KB, so an answer the client does not read waits in the server."""
    import socket
    import threading

    import uvicorn

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited by the accepted connections
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http=guarded_protocol(**guards))
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    client = socket.socket()
    try:
        wait_until(lambda: server.started, 30, "the server to start")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(listener.getsockname())
        yield server, client
    finally:
        client.close()
        server.should_exit = True
        thread.join(30)
        listener.close()


def _dropped(server) -> None:
    """The one connection ends, its write buffer freed, and the app's task for it with it."""
    (held,) = wait_until(lambda: set(server.server_state.connections), 30, "the connection")
    wait_until(lambda: not server.server_state.connections, 30, "the unread connection to be dropped")
    assert held._socket_transport.is_closing() and held._socket_transport.get_write_buffer_size() == 0
    wait_until(lambda: not server.server_state.tasks, 30, "the app's task for the answer to end")


@pytest.mark.parametrize("connection", ["close", "keep-alive"])
def test_an_answer_the_client_never_reads_is_dropped_after_the_send_timeout(connection):
    """A client that asks and never reads: past the kernel's socket buffers the answer waits in asyncio's buffer,
    and closing the connection (after ``Connection: close``, or the keep-alive header timeout) waits for that
    buffer to drain. With ``send_timeout`` the connection is aborted, its buffer freed, the app's task ended."""
    guards = {"header_timeout": 0.2, "max_connections": 10, "send_timeout": 0.5}
    with _served_on_a_socket(_big_answer_app(), **guards) as (server, client):
        client.sendall(b"GET /big HTTP/1.1\r\nHost: a\r\nConnection: %s\r\n\r\n" % connection.encode())
        (held,) = wait_until(lambda: set(server.server_state.connections), 30, "the connection")
        wait_until(lambda: held.transport.get_write_buffer_size() > BIG // 2, 30, "the answer to wait in the buffer")
        _dropped(server)


def test_a_huge_bad_value_from_a_client_that_never_reads_holds_nothing(fake_predictor):
    """The whole provocation on the real app: 3 MB of ``truncation_direction``, and the answer never read. The
    error quotes 40 characters of it, the answer leaves, and the connection closes at the header timeout (the
    send timeout would abort it, were the answer stuck): nothing of it stays in the server."""
    from distrinews.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=fake_predictor)
    body = json.dumps({"inputs": "a", "truncation_direction": "x" * (3 * 1024 * 1024)}).encode()
    head = b"POST /predict HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    guards = {"header_timeout": 0.5, "max_connections": 10, "body_timeout": 30.0, "send_timeout": 1.0}
    with _served_on_a_socket(app, **guards) as (server, client):
        wait_until(lambda: app.state.serve.batcher is not None, 30, "the model to load")
        client.sendall(head % len(body) + body)
        _dropped(server)

"""nginx as ``serve-replicas`` runs it (``serve/nginx.py``'s configuration, started as the supervisor starts it), in
front of stand-in replicas: small HTTP servers on loopback that answer every request 200, or 503 as a replica still
loading its model does. They stand in for the replicas so that what is checked is nginx's part alone, in seconds:
every POST route of the app is resent to the next replica, and one client address over its limits is refused while
another is served. Clients of other addresses are 127.0.0.2 and 127.0.0.3 (all of 127/8 is loopback on Linux).
``test_serve_replicas.py`` runs the whole: real replicas, a rolling restart under load.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import unavailable, wait_until

pytestmark = pytest.mark.slow


class Stub:
    """A stand-in replica on a loopback port: answers every request ``status`` with a JSON body; records the paths."""

    def __init__(self, status: int):
        self.paths: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream connections are

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.paths.append(self.path)
                body = json.dumps({"status": status}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # nginx may open many connections at once; 5 (the default) would refuse some

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def front(tmp_path: Path, statuses: list[int], **limits: int) -> Iterator[tuple[int, list[Stub]]]:
    """nginx on a free port with serve-replicas' configuration (fail_timeout 1 s, header timeout 2 s) in front of a
    stand-in replica per status: (nginx's port, the stand-ins)."""
    from distrinews.distributed.launch import free_ports
    from distrinews.distributed.lifetime import stop_processes
    from distrinews.serve.children import get_json, start_child
    from distrinews.serve.nginx import connection_budget, find_nginx, nginx_conf
    from distrinews.serve.options import ServeOptionError

    try:
        binary = find_nginx()
    except ServeOptionError as exc:
        unavailable(f"nginx is not installed: {exc}")
    stubs = [Stub(status) for status in statuses]
    (port,) = free_ports(1)
    connections, files = connection_budget()
    conf = tmp_path / "nginx.conf"
    timeouts = {"fail_timeout": 1, "header_timeout": 2, "read_timeout": 10}
    conf.write_text(nginx_conf(temp=tmp_path, log_dir=tmp_path, listen=f"127.0.0.1:{port}", max_body_bytes=1 << 20,
                               replica_ports=[s.port for s in stubs], worker_connections=connections, **timeouts,
                               **limits))  # fmt: skip
    cmd = [binary, "-c", str(conf), "-p", str(tmp_path), "-e", str(tmp_path / "nginx-error.log")]
    proc = start_child(cmd, tmp_path / "nginx.log", open_files=files)
    try:
        answering = lambda: proc.poll() is not None or get_json(f"http://127.0.0.1:{port}/health")[0] == 200  # noqa: E731
        wait_until(answering, 30, "nginx answering (or exiting)")
        assert proc.poll() is None, (tmp_path / "nginx.log").read_text() + (tmp_path / "nginx-error.log").read_text()
        yield port, stubs
    finally:
        stop_processes(proc, grace_s=10, sig=signal.SIGQUIT)
        for stub in stubs:
            stub.close()


def post(port: int, path: str = "/predict", source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", path, json.dumps({"text": "Oil prices jump"}), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_every_post_route_of_the_app_is_resent_to_the_next_replica(tmp_path, fake_predictor):
    """The routes are the app's own: a POST route added to it is checked here without being named."""
    from distrinews.serve.app import create_app
    from distrinews.serve.options import ServeConfig

    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=fake_predictor)
    paths = sorted(route.path for route in app.routes if "POST" in getattr(route, "methods", ()))
    assert {"/predict", "/predict/batch", "/", "/invocations"} <= set(paths)
    with front(tmp_path, [503, 200]) as (port, (loading, _)):
        for path in paths:
            answers: list[int] = []

            def tried_the_loading_replica(path: str = path, answers: list[int] = answers) -> bool:
                answers.append(post(port, path)[0])
                return path in loading.paths

            # nginx rests a replica that failed a request for fail_timeout (1 s), then tries it again
            wait_until(tried_the_loading_replica, 30, f"nginx trying the loading replica with POST {path}", 0.05)
            assert set(answers) == {200}, f"POST {path}: {answers}"


def trickle_body(port: int, source: str) -> socket.socket:
    """A request whose headers arrived and whose body comes a byte at a time: its connection is in progress."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    return s


def test_a_client_over_its_connection_limit_is_refused_while_another_is_served(tmp_path):
    with front(tmp_path, [200], client_connections=4, client_rate=0) as (port, _):
        held = [trickle_body(port, "127.0.0.2") for _ in range(4)]
        stop = threading.Event()

        def keep_sending() -> None:  # a byte every 0.5 s: well inside the body timeout (2 s a read)
            while not stop.wait(0.5):
                for s in held:
                    s.sendall(b" ")

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        try:
            # the four count once nginx has read their headers: asked again until it has
            refused = wait_until(lambda: (a := post(port, source="127.0.0.2"))[0] == 429 and a, 20, "a 429", 0.1)
            _, headers, body = refused
            assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
            assert "at most 4 requests at once (--client-connections" in json.loads(body)["detail"]
            assert post(port, source="127.0.0.1")[0] == 200  # another address is served meanwhile
            assert post(port, source="127.0.0.3")[0] == 200
        finally:
            stop.set()
            sender.join(10)
        for s in held:  # still held open, not cut: what was refused was the fifth
            s.sendall(b" ")
            s.close()
        wait_until(lambda: post(port, source="127.0.0.2")[0] == 200, 20, "127.0.0.2 served again once it let go")


def test_a_client_over_its_request_rate_is_refused_while_another_is_served(tmp_path):
    with front(tmp_path, [200], client_connections=0, client_rate=5) as (port, _):
        # 30 requests sent at once from one address: 5 a second with 5 more at once pass, the rest are refused
        conns = [socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.3", 0))
                 for _ in range(30)]  # fmt: skip
        started = time.monotonic()
        request = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        for s in conns:
            s.sendall(request)
        statuses = []
        for s in conns:
            statuses.append(int(s.makefile("rb").readline().split()[1]))
            s.close()
        passed = 1 + 5 + 5 * (time.monotonic() - started)  # the first, the burst, and what the rate let through since
        assert set(statuses) == {200, 429} and statuses.count(200) <= passed, statuses
        assert post(port, source="127.0.0.1")[0] == 200

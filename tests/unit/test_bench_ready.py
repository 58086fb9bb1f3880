"""``wait_ready``, the readiness poller of the serving benchmarks and of the HTTP tests' ``ServerProcess``, and
``reported_port``: the servers under test bind port 0 and name the port they got."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from distrinews.bench import serving_limit
from distrinews.bench.serving_servers import Server, ServerNotReady, reported_port, wait_ready


class Answers:
    """A loopback server that answers each GET with the next ``(status, body)`` of ``script``, the last one
    again once the script runs out; ``served`` is what it answered."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict]] = []
        self.served: list[tuple[int, dict]] = []
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                status, body = answers.script[min(len(answers.served), len(answers.script) - 1)]
                answers.served.append((status, body))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ready"


@pytest.fixture
def answers() -> Iterator[Answers]:
    answers = Answers()
    threading.Thread(target=answers.server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield answers
    finally:
        answers.server.shutdown()
        answers.server.server_close()


class _Exited:
    returncode = 3

    def poll(self) -> int:
        return self.returncode


def test_waits_through_503_until_200(answers):
    answers.script += [(503, {"detail": "model is still loading"})] * 2 + [(200, {"status": "ready"})]
    wait_ready(answers.url, timeout=10, interval=0.01)
    assert [status for status, _ in answers.served] == [503, 503, 200]


def test_a_200_that_says_the_model_is_not_loaded_is_not_ready(answers):
    answers.script += [(200, {"model_loaded": False}), (200, {"model_loaded": True})]
    wait_ready(answers.url, timeout=10, interval=0.01)
    assert [body["model_loaded"] for _, body in answers.served] == [False, True]


def test_a_process_that_exited_is_reported_at_once(answers):
    answers.script.append((503, {}))
    with pytest.raises(ServerNotReady, match=r"^exited with 3 before it was ready$"):
        wait_ready(answers.url, _Exited(), timeout=10)
    assert answers.served == [], "no request once the process is gone"


def test_gives_up_after_the_timeout(answers):
    answers.script.append((503, {}))
    with pytest.raises(ServerNotReady, match=r"^not ready after 0.3s$"):
        wait_ready(answers.url, timeout=0.3, interval=0.05)
    assert len(answers.served) >= 2


def test_the_port_is_read_from_the_listening_line_and_an_early_exit_is_named(tmp_path):
    log = tmp_path / "server.log"
    line = "INFO:     Uvicorn running on http://127.0.0.1:40123 (Press CTRL+C to quit)"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"print({line!r}, flush=True); import time; time.sleep(30)"], stdout=out
        )
    try:
        assert reported_port(log, proc, timeout=30, interval=0.01) == 40123
    finally:
        proc.kill()
        proc.wait()
    with open(log, "wb") as out:
        gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"], stdout=out)
    with pytest.raises(ServerNotReady, match=r"^exited with 4 before it listened$"):
        reported_port(log, gone, timeout=30, interval=0.01)


def test_a_server_under_test_binds_port_0_and_is_reached_on_the_port_it_got(tmp_path):
    """No port is picked and released before the server binds it (another process could take it, and the benchmark
    would then load whoever did): the empty responder of bench serving starts on port 0 and is found where it is."""
    server = Server("empty", serving_limit.empty_responder_command(0), "/ready", tmp_path / "empty.log")
    try:
        server.wait_ready(timeout=60)
        assert server.port and server.port > 0
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/predict", b'{"text": "x"}', method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200 and answer.read() == serving_limit.EMPTY_ANSWER
    finally:
        server.stop()

"""``wait_ready``, the readiness poller of the serving benchmarks and of the HTTP tests' ``ServerProcess``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from distrinews.bench.serving_servers import ServerNotReady, wait_ready


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

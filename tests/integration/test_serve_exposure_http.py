"""What an attacker or a bad day can do to a server exposed on a network, provoked for real.

The server is the real one (``run_server``: uvicorn, our connection protocol, middlewares and
app) on a loopback port, in its own process, with the model replaced by a predictor whose
forward pass can be made to raise, hang or record (``SCRIPT``): slow bodies on raw sockets, with
and without the API key; methods h11 accepts but no one uses, as metrics labels; a text that
breaks its batch; a forward pass that hangs; and, in a second process, a batching loop that dies.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import reported_port
from distrinews.distributed.lifetime import stop_processes

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "exposure-key-5678"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_TIMEOUT = 5.0  # seconds: long enough for a loaded CI machine to set up each scene before it fires
FORWARD_TIMEOUT = 6.0
MAX_BODY = 64 * 1024
MAX_PENDING = 128 * 1024

# argv: port, work folder, then "die" for a server whose batching loop dies on a text "die".
SCRIPT = r'''
import json, sys, time
from pathlib import Path

from distrinews.serve.options import ServeConfig
from distrinews.serve.server import run_server

port, work = int(sys.argv[1]), Path(sys.argv[2])
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


class Predictor:
    """Answers "World"; a text "boom" raises, "hang" waits for WORK/release-hang, "hold" for WORK/release-hold."""

    runtime = "injected"
    labels = LABELS

    def warmup(self):
        pass

    def encode(self, texts):
        return list(texts)

    def predict_encoded(self, batch):
        with open(work / "batches.jsonl", "a") as f:
            f.write(json.dumps(batch) + "\n")
        for word in ("hang", "hold"):
            if word in batch:
                deadline = time.monotonic() + 120
                while not (work / f"release-{word}").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        if "boom" in batch:
            raise ValueError("tensor size mismatch in /opt/secret/model.py line 7")
        return [
            {"label": "World", "label_id": 0, "confidence": 1.0, "probabilities": dict.fromkeys(LABELS, 0.25)}
            for _ in batch
        ]

    def describe(self):
        return {"model_name": "injected", "runtime": self.runtime, "labels": LABELS, "max_length": 8, "metrics": {}}


if sys.argv[3:] == ["die"]:
    from distrinews.serve.batcher import MicroBatcher
    from distrinews.serve.metrics import ServeMetrics

    def broken_metrics(self, stats):
        raise RuntimeError("a metric broke")

    take = MicroBatcher._take

    def take_or_die(self, cap=None):
        if any(request.texts == ["die"] for request in self._ready):
            raise RuntimeError("a bug in the batching loop")
        return take(self, cap)

    ServeMetrics.observe_batch = broken_metrics
    MicroBatcher._take = take_or_die

config = ServeConfig(host="127.0.0.1", port=port, max_wait_ms=50, no_access_log=True, **LIMITS)
sys.exit(run_server(config, Predictor))
'''.replace(
    "LIMITS",
    repr(
        dict(
            body_timeout=BODY_TIMEOUT,
            forward_timeout=FORWARD_TIMEOUT,
            max_body_bytes=MAX_BODY,
            max_pending_body_bytes=MAX_PENDING,
        )
    ),
)


class Injected:
    """``SCRIPT`` in a process of its own, output in WORK/server.log."""

    def __init__(self, work: Path, *args: str):
        self.work = work
        (work / "server.py").write_text(SCRIPT)
        self._log = open(work / "server.log", "wb")
        env = {**os.environ, "DISTRINEWS_API_KEY": API_KEY, "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, str(work / "server.py"), "0", str(work), *args]  # port 0: the one it got is logged
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return (self.work / "server.log").read_text(errors="replace")

    def wait_ready(self) -> Injected:
        from distrinews.bench.serving_servers import ServerNotReady, wait_ready

        try:
            self.port = reported_port(self.work / "server.log", self.proc, 120)
            wait_ready(self.url + "/ready", self.proc, 120)
        except ServerNotReady as exc:
            self.stop()
            raise AssertionError(f"server {exc}:\n{self.log()[-4000:]}") from None
        except BaseException:
            self.stop()  # the caller's try/finally may start after this returns: never leave it running
            raise
        return self

    def batches(self) -> list[list[str]]:
        path = self.work / "batches.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        stop_processes(self.proc, grace_s=30)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Injected(tmp_path_factory.mktemp("exposed"))
    try:
        yield srv.wait_ready()
    finally:
        (srv.work / "release-hang").touch()
        (srv.work / "release-hold").touch()
        srv.stop()


def _metrics(server: Injected) -> str:
    return httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text


def _gauge(server: Injected, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", _metrics(server), re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


# ---------------------------------------------------------------------- slow bodies
def _open(port: int, method: str, path: str, declared: int, sent: int, auth: bool) -> socket.socket:
    """A request whose headers declare ``declared`` body bytes, of which only ``sent`` are sent."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n"
    head += f"Authorization: Bearer {API_KEY}\r\n" if auth else ""
    s.sendall(head.encode() + b"\r\n" + b" " * sent)
    return s


def _answer(s: socket.socket) -> tuple[bytes, bool]:
    """What the server answered on ``s`` (b"" for nothing) and whether it then closed the connection."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread bytes: still a close
        pass
    except TimeoutError:
        return data, False
    finally:
        s.close()
    return data, True


def _status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_slow_bodies_are_cut_at_the_deadline_and_bounded_while_the_probes_answer(server):
    port = server.port
    public_post = _open(port, "POST", "/health", MAX_BODY - 1, 1_000, auth=False)  # a method the probe does not serve
    keyless = _open(port, "POST", "/predict", MAX_BODY - 1, 1_000, auth=False)  # 401 before its body is read
    keyed = [
        _open(port, "POST", "/predict", MAX_BODY - 1, 60_000, auth=True) for _ in range(2)
    ]  # read, as the key is right
    _until(lambda: _gauge(server, "distrinews_pending_body_bytes") == 120_000, "the two keyed bodies are pending")
    over_budget = _open(port, "POST", "/predict/batch", MAX_BODY - 1, 20_000, auth=True)
    # A fresh probe, and a full request, answer while all of these wait for their bodies.
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200
    assert (
        httpx.post(server.url + "/predict", json={"text": "Oil prices jump"}, headers=AUTH, timeout=10).status_code
        == 200
    )

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(_answer, [public_post, keyless, *keyed, over_budget]))
    (public, public_closed), (unauthorized, unauthorized_closed), *read, (busy, busy_closed) = answers
    assert _status(public) == 405 and b"allow: GET" in public and public_closed, public
    assert _status(unauthorized) == 401 and unauthorized_closed, unauthorized
    for answer, closed in read:
        assert _status(answer) == 408 and b"--body-timeout" in answer and closed, answer
    assert _status(busy) == 503 and b"--max-pending-body-bytes" in busy and b"retry-after: 1" in busy.lower(), busy
    assert busy_closed
    _until(lambda: _gauge(server, "distrinews_pending_body_bytes") == 0, "the pending bytes are given back")
    metrics = _metrics(server)
    assert re.search(
        r'^distrinews_http_requests_total\{method="POST",route="<unmatched>",status="408"\} 2\.0$', metrics, re.M
    ), [line for line in metrics.splitlines() if line.startswith("distrinews_http_requests_total")]


# ---------------------------------------------------------------------- metric labels
def test_methods_no_one_uses_share_one_label(server):
    for i in range(5):
        for path in ("/predict", "/health", f"/nowhere-{i}"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                s.sendall(f"M{i} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
                assert _status(s.recv(65536)) in (401, 405), path
    metrics = _metrics(server)
    methods = set(re.findall(r'^distrinews_http_requests_total\{[^}]*method="([^"]*)"', metrics, re.M))
    routes = set(re.findall(r'^distrinews_http_requests_total\{[^}]*route="([^"]*)"', metrics, re.M))
    assert methods <= {"GET", "POST", "other"} and "other" in methods, methods
    assert not any("nowhere" in route for route in routes), routes


# ---------------------------------------------------------------------- the forward pass
def _post_texts(server: Injected, *texts: str) -> list[httpx.Response]:
    with ThreadPoolExecutor(len(texts)) as pool:
        return list(
            pool.map(lambda t: httpx.post(server.url + "/predict", json={"text": t}, headers=AUTH, timeout=60), texts)
        )


def test_a_text_that_breaks_its_batch_fails_alone_and_names_no_internals(server):
    (server.work / "release-hold").unlink(missing_ok=True)
    holding = threading.Thread(target=_post_texts, args=(server, "hold"))
    holding.start()  # the model is busy with it while the next three queue up: they share the next pass
    try:
        _until(lambda: ["hold"] in server.batches(), "the model is busy")
        requests = ThreadPoolExecutor(1).submit(_post_texts, server, "fine one", "boom", "fine two")
        _until(lambda: _gauge(server, "distrinews_queue_depth") == 3, "three requests queued")
    finally:  # never leave the module's server holding its model for the next test
        (server.work / "release-hold").touch()
    holding.join(60)
    first, bad, second = requests.result(60)
    assert first.status_code == 200 and second.status_code == 200
    assert (
        bad.status_code == 500
        and bad.json()["detail"] == "the model failed on this request's texts (the server log has the details)"
    )
    assert "secret" not in bad.text and "ValueError" not in bad.text
    shared = next(b for b in server.batches() if "boom" in b and len(b) == 3)
    assert sorted(shared) == ["boom", "fine one", "fine two"]
    assert "/opt/secret/model.py" in server.log()  # the operator sees what failed


def test_a_forward_past_its_deadline_turns_ready_and_requests_to_503_until_it_returns(server):
    (server.work / "release-hang").unlink(missing_ok=True)
    try:
        (stuck,) = _post_texts(server, "hang")  # answered at the deadline, while the pass still runs
        assert stuck.status_code == 503 and "the model is stuck" in stuck.json()["detail"], stuck.text
        ready = httpx.get(server.url + "/ready", timeout=10)
        assert ready.status_code == 503 and f"--forward-timeout is {FORWARD_TIMEOUT:g}s" in ready.json()["detail"]
        (refused,) = _post_texts(server, "Oil prices jump")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "stuck" in refused.json()["detail"]
    finally:  # the module's server is left as it was found, whatever failed: no later test inherits a stuck model
        (server.work / "release-hang").touch()
    _until(lambda: httpx.get(server.url + "/ready", timeout=10).status_code == 200, "ready again once the pass returns")
    assert _post_texts(server, "Oil prices jump")[0].status_code == 200


# ---------------------------------------------------------------------- a batching loop that dies
def test_a_batching_loop_that_dies_ends_the_process_for_its_supervisor(tmp_path):
    srv = Injected(tmp_path, "die").wait_ready()
    try:
        # Its metrics raise after every batch: logged, and the next request is still answered.
        for text in ("Oil prices jump", "Stocks fall"):
            assert _post_texts(srv, text)[0].status_code == 200
        (dead,) = _post_texts(srv, "die")
        assert dead.status_code == 503 and "the batching loop died" in dead.json()["detail"], dead.text
        assert srv.proc.wait(60) == 1, srv.log()[-4000:]
    finally:
        srv.stop()
    log = srv.log()
    assert "on_batch failed" in log and "a metric broke" in log
    assert "the batching loop died (RuntimeError); no request can be answered any more" in log

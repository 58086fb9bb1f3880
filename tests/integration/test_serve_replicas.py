"""Serving past one process, over real HTTP: slow clients against one server, and ``distrinews serve-replicas``
(two ``distrinews serve`` replicas behind nginx) under a bounded load while a replica is killed, while the
replicas roll to a new model version, and with every replica gone; then SIGKILL to the supervisor.

Loopback only; the tiny random model (two copies, model versions 1.0.0 and 2.0.0). Every test that kills or rolls
replicas starts its own, so none depends on another's order; every server binds a port of its own choosing and
says which. The replica tests skip when nginx is not installed (``.ci/run`` installs it; under CI they fail).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import unavailable, wait_until
from distrinews.distributed.lifetime import stop_processes

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "Oil prices jump after OPEC agrees to cut production",
    "Chelsea beat Arsenal in the cup final",
    "Apple unveils a new iPhone with a faster chip",
    "Elections in France: the president concedes",
    "Stocks fall as the central bank raises rates",
    "NASA launches a probe to study the sun",
]

# POST routes that classify (the seed's shape is answered in the seed's shape on each)
PREDICTION_ROUTES = ("/predict", "/", "/invocations")


def _nginx_missing() -> str | None:
    from distrinews.serve.nginx import find_nginx
    from distrinews.serve.options import ServeOptionError

    try:
        find_nginx()
    except ServeOptionError as exc:
        return str(exc)
    return None


def _checkpoint(path: Path, version: str, seed: int) -> Path:
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=seed).eval()
    info = ServableInfo(max_length=32, model_version=version)
    return save_servable(path, model, model.state_dict(), build_tokenizer("tiny-random"), info)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("replicas-models")
    return {"1.0.0": _checkpoint(root / "v1", "1.0.0", 0), "2.0.0": _checkpoint(root / "v2", "2.0.0", 1)}


# --------------------------------------------------------------------------------------------- one server, slow clients
# How long a half-sent request may stay open: well past the header timeouts set here (2 and 6 s), well short of
# what holds it without them (nginx's default 60 s; uvicorn, for ever). The test shows the timeout, not a speed.
HALF_SENT_DEADLINE = 30.0


def _half_headers(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")  # and then nothing
    return s


def _closed_within(sockets: list[socket.socket], seconds: float) -> tuple[int, list[bytes]]:
    """How many of ``sockets`` the server closed within ``seconds``, and what it sent before closing."""
    deadline, closed, sent = time.monotonic() + seconds, 0, []
    for s in sockets:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = s.recv(4096)
            while data and (more := s.recv(4096)):
                data += more
            closed += 1
            sent.append(data)
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed += 1
        finally:
            s.close()
    return closed, sent


def _predict(port: int, text: str = "Oil prices jump") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/predict", json.dumps({"text": text}), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_server_closes_half_sent_headers_and_caps_connections(checkpoints, tmp_path, server_process):
    srv = server_process(
        checkpoints["1.0.0"],
        tmp_path / "server.log",
        "--runtime",
        "torch",
        "--header-timeout",
        # The 52 must still be open when the 53rd connects, a few connects and one tiny prediction later: 6 s is
        # a wide margin for that, and the wait for them to be cut below is not a measure of it.
        "6",
        "--max-connections",
        "52",
    ).wait_ready()
    try:
        slow = [_half_headers(srv.port) for _ in range(50)]
        status, headers, _ = _predict(srv.port)  # the 51st connection: served while the 50 hang
        assert status == 200 and headers["x-model-version"] == "1.0.0"
        slow += [_half_headers(srv.port) for _ in range(2)]
        # The 53rd, over --max-connections. No wait for the two before it: the kernel queues connections in order
        # and the server's loop accepts them in that order, so they are counted first.
        refused = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        closed, sent = _closed_within([refused], HALF_SENT_DEADLINE)
        assert closed == 1 and sent[0].startswith(b"HTTP/1.1 503"), sent
        head, _, body = sent[0].partition(b"\r\n\r\n")
        assert b"retry-after: 1" in head.lower() and "--max-connections" in json.loads(body)["detail"]
        closed, _ = _closed_within(slow, HALF_SENT_DEADLINE)  # uvicorn alone would hold them for ever
        assert closed == 52, f"{52 - closed} of 52 half-sent requests still open after the header timeout"
        assert _predict(srv.port)[0] == 200
        assert "--header-timeout" in srv.log()
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------- replicas behind nginx
class Replicas:
    def __init__(
        self,
        checkpoint_link: Path,
        log_dir: Path,
        *args: str,
        env: dict[str, str] | None = None,
        open_files: int | None = None,
    ):
        self.port = 0  # --port 0: nginx's port is named in the ready line (wait_ready)
        self.link, self.log_dir = checkpoint_link, log_dir
        self.pid_file = log_dir / "supervisor.pid"
        self.out_path = log_dir / "supervisor.out"
        cmd = [
            sys.executable,
            "-m",
            "distrinews",
            "serve-replicas",
            "--checkpoint",
            str(checkpoint_link),
            "--replicas",
            "2",
        ]
        cmd += [
            "--port",
            str(self.port),
            "--threads",
            "1",
            "--log-dir",
            str(log_dir),
            "--pid-file",
            str(self.pid_file),
            *args,
        ]
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
            cwd=ROOT,
            preexec_fn=None if open_files is None else lambda: _soft_open_files(open_files),
        )

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, phrase: str, timeout: float = 120) -> None:
        def said() -> bool:
            assert self.proc.poll() is None, f"serve-replicas exited with {self.proc.returncode}:\n{self.out()}"
            return phrase in self.out()

        wait_until(said, timeout, f"{phrase!r} from serve-replicas", interval=0.1)

    def wait_ready(self) -> None:
        self.wait_for("ready on")
        self.port = int(re.search(r"ready on http://127\.0\.0\.1:(\d+):", self.out()).group(1))

    def answered(self, port: int) -> bool:
        """Whether the replica on ``port`` answers /ready."""
        from distrinews.serve.children import get_json

        return get_json(f"http://127.0.0.1:{port}/ready")[0] == 200

    def children(self) -> list[int]:
        from distrinews.distributed.launch import child_pids

        return child_pids(self.proc.pid)

    def replica_pids(self) -> dict[int, int]:
        """port -> pid of each replica (from its command line)."""
        found = {}
        for pid in self.children():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and b"--port" in argv:
                found[int(argv[argv.index(b"--port") + 1])] = pid
        return found


class Load:
    """32 client threads, each with its own keep-alive connection through nginx, pacing its requests,
    until stopped; every answer (or failure) recorded. The predictions go to each of ``routes`` in turn."""

    def __init__(self, port: int, clients: int = 32, pause: float = 0.25, routes: tuple[str, ...] = ("/predict",)):
        self.port, self.pause, self.routes = port, pause, routes
        self.answers: list[tuple[str, int, str | None, dict]] = []  # (path or text, status, X-Model-Version, body)
        self.failures: list[str] = []
        self.failed_routes: dict[str, int] = {}
        self.sent = 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)

    def _client(self, k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        i = k
        while not self._stop.is_set():
            info = i % 8 == 0  # one request in 8 asks /info: its body names the model version too
            text, route = TEXTS[i % len(TEXTS)], self.routes[(i // len(self.threads) + k) % len(self.routes)]
            with self._lock:
                self.sent += 1
            try:
                if info:
                    conn.request("GET", "/info")
                else:
                    conn.request("POST", route, json.dumps({"text": text}), {"Content-Type": "application/json"})
                r = conn.getresponse()
                body = r.read()
                record = ("/info" if info else text, r.status, r.getheader("x-model-version"), json.loads(body))
                with self._lock:
                    self.answers.append(record)
                    if r.status != 200:
                        self._failed("/info" if info else route, f"{r.status} {body[:200]!r}")
            except Exception as exc:  # a reset or refused connection through nginx is a lost request
                with self._lock:
                    self._failed("/info" if info else route, f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            i += len(self.threads)
            self._stop.wait(self.pause)
        conn.close()

    def _failed(self, route: str, what: str) -> None:
        self.failures.append(f"{route}: {what}")
        self.failed_routes[route] = self.failed_routes.get(route, 0) + 1

    def count(self) -> int:
        with self._lock:
            return len(self.answers) + len(self.failures)

    def wait_answers(self, n: int, timeout: float = 120) -> int:
        """Wait until ``n`` requests have been answered (or failed): the load is flowing, whatever the speed."""
        return wait_until(lambda: (done := self.count()) >= n and done, timeout, f"{n} answers ({self.count()} so far)")

    def check(self, atol: float) -> set[str]:
        """No failed or lost request, every answer names its version, and none mixes them: the versions seen."""
        assert not self.failures, f"{len(self.failures)} of {self.sent} requests failed: {self.failures[:5]}"
        assert len(self.answers) == self.sent, f"{self.sent - len(self.answers)} requests lost"
        seen: dict[tuple[str, str], dict] = {}
        for what, _, version, body in self.answers:
            assert version, f"an answer without X-Model-Version: {body}"
            if what == "/info":
                assert body["model_version"] == version, f"/info says {body['model_version']}, its header {version}"
                continue
            first = seen.setdefault((what, version), body["probabilities"])
            for label, p in body["probabilities"].items():
                assert abs(p - first[label]) <= atol, f"{what!r} under {version}: {body} vs {first}"
        return {version for _, _, version, _ in self.answers}


def _soft_open_files(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@contextlib.contextmanager
def serve_replicas(
    checkpoint: Path, root: Path, env: dict[str, str] | None = None, open_files: int | None = None
) -> Iterator[Replicas]:
    """``distrinews serve-replicas`` (2 replicas) of ``root/current`` -> ``checkpoint``, ready; stopped after.
    ``open_files``: its soft limit on open files."""
    if why := _nginx_missing():
        unavailable(f"nginx is not installed: {why}")
    link = root / "current"
    link.symlink_to(checkpoint)
    args = ("--runtime", "torch", "--header-timeout", "2", "--fail-timeout", "1", "--max-batch-texts", "4")
    running = Replicas(link, root, *args, env=env, open_files=open_files)
    try:
        running.wait_ready()
        yield running
    finally:
        stop_processes(running.proc, grace_s=60)
        running._out.close()


@pytest.fixture(scope="module")
def replicas(checkpoints, tmp_path_factory):
    """serve-replicas for the tests that leave it as they found it; every test that kills or rolls a replica starts
    its own, so none depends on another's order."""
    # started as a shell's usual soft limit on open files (1,024) leaves it: nginx needs more
    with serve_replicas(checkpoints["1.0.0"], tmp_path_factory.mktemp("replicas"), open_files=1024) as running:
        yield running


def test_replicas_pass_our_errors_through_unchanged(replicas):
    def post(path: str, body: str, content_type: str = "application/json") -> tuple[int, str, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", replicas.port, timeout=30)
        conn.request("POST", path, body, {"Content-Type": content_type})
        r = conn.getresponse()
        return r.status, r.getheader("content-type"), json.loads(r.read())

    status, kind, body = post("/predict/batch", json.dumps({"texts": ["a", "b", "c", "d", "e"]}))
    assert (status, kind) == (413, "application/json") and "the limit is 4" in body["detail"]
    status, kind, body = post("/predict", '{"text": "x"}', "text/plain")
    assert (status, kind) == (415, "application/json") and "Content-Type" in body["detail"]
    status, kind, body = post("/predict", '{"text": "   "}')
    assert (status, kind) == (422, "application/json") and "empty" in body["detail"]


def test_nginx_gets_the_open_files_its_connections_need(replicas):
    """With master_process off nginx ignores worker_rlimit_nofile: at 1,024 open files it would stop accepting
    connections near a thousand, whatever worker_connections says. serve-replicas raises its limit."""
    import resource

    from distrinews.serve.nginx import MAX_CONNECTIONS, SPARE_FILES

    (nginx,) = [p for p in replicas.children() if b"nginx" in Path(f"/proc/{p}/cmdline").read_bytes()]
    limits = Path(f"/proc/{nginx}/limits").read_text()
    soft = int(re.search(r"^Max open files\s+(\d+)", limits, flags=re.M).group(1))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = 2 * MAX_CONNECTIONS + SPARE_FILES
    assert soft == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)), limits
    connections = int(re.search(r"nginx: (\d+) connections at most", replicas.out()).group(1))
    assert 2 * connections + SPARE_FILES <= soft


def test_nginx_closes_half_sent_headers(replicas):
    slow = [_half_headers(replicas.port) for _ in range(20)]
    assert _predict(replicas.port)[0] == 200
    closed, _ = _closed_within(slow, HALF_SENT_DEADLINE)  # client_header_timeout is 2 s here, nginx's default 60 s
    assert closed == 20, f"{20 - closed} of 20 half-sent requests still open after nginx's client_header_timeout"


def test_replicas_killed_one_then_all_then_the_supervisor(checkpoints, tmp_path, padding_atol):
    """SIGKILL to one replica under load fails no request; with every replica down, nginx answers a one-line JSON
    503; SIGKILL to serve-replicas then leaves nothing running. One story on servers of its own, in this order."""
    with serve_replicas(checkpoints["1.0.0"], tmp_path) as running:
        before = running.replica_pids()
        assert len(before) == 2, before
        port, victim = sorted(before.items())[0]
        with Load(running.port) as load:
            load.wait_answers(32)
            os.kill(victim, signal.SIGKILL)
            killed_at = load.count()
            # the load runs through the whole outage: until the replica is back, and then some
            running.wait_for("exited with -9: starting it again", timeout=60)
            wait_until(lambda: running.answered(port), 120, "the killed replica answering /ready again")
            load.wait_answers(killed_at + 64)
        assert load.check(padding_atol) == {"1.0.0"}

        children = running.children()
        assert any(b"nginx" in Path(f"/proc/{p}/cmdline").read_bytes() for p in children), children
        replicas = list(running.replica_pids().values())
        assert len(replicas) == 2, replicas
        # stopped, the supervisor cannot start the replicas again before the request below reaches nginx
        os.kill(running.proc.pid, signal.SIGSTOP)
        try:
            for pid in replicas:
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not any(_running(p) for p in replicas), 30, "both replicas dead")
            conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
            conn.request("POST", "/predict", json.dumps({"text": "Oil"}), {"Content-Type": "application/json"})
            r = conn.getresponse()
            body = r.read()
        finally:
            os.kill(running.proc.pid, signal.SIGKILL)  # a stopped process takes SIGKILL too
        assert r.status == 503 and r.getheader("content-type") == "application/json"
        assert r.getheader("retry-after") == "1"
        assert body.count(b"\n") <= 1 and "no replica is available" in json.loads(body)["detail"], body
        running.proc.wait(30)
        alive = lambda: [p for p in children if _running(p)]  # noqa: E731
        wait_until(lambda: not alive(), 30, f"nothing running after SIGKILL to serve-replicas (left: {alive()})")


# Loaded by every Python process of serve-replicas through PYTHONPATH: the replica that first sends the
# headers of its {after}th /predict answer kills itself before the body (once: the marker file says so).
_DIE_BETWEEN_HEADERS_AND_BODY = """
import os, signal
from uvicorn.protocols.http import h11_impl

_send, _answers = h11_impl.RequestResponseCycle.send, 0


async def send(self, message):
    global _answers
    await _send(self, message)
    if message["type"] == "http.response.start" and self.scope["path"] == "/predict":
        _answers += 1
        if _answers == {after}:
            try:
                os.close(os.open({marker!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)


h11_impl.RequestResponseCycle.send = send
"""


def test_a_replica_killed_between_an_answer_s_headers_and_body_fails_no_request(checkpoints, tmp_path, padding_atol):
    """The kill lands where a truncated answer would reach the client if the headers left on their own."""
    marker, site = tmp_path / "killed", tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_DIE_BETWEEN_HEADERS_AND_BODY.format(after=20, marker=str(marker)))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    with serve_replicas(checkpoints["1.0.0"], tmp_path, env) as running:
        with Load(running.port) as load:
            wait_until(marker.exists, 120, f"a replica killing itself ({load.sent} requests sent)", interval=0.1)
            killed_at = load.count()
            running.wait_for("exited with -9: starting it again", timeout=60)
            load.wait_answers(killed_at + 32)
        assert load.check(padding_atol) == {"1.0.0"}


def test_rolling_restart_to_a_new_version_loses_no_request_and_mixes_none(checkpoints, tmp_path, padding_atol):
    """On every prediction route: a new replica answers 503 while its model loads, and nginx must resend each of
    them elsewhere (POST / and /invocations once fell into ``location /``, and some twenty per roll failed)."""
    from distrinews.serve.children import get_json

    with serve_replicas(checkpoints["1.0.0"], tmp_path) as running:
        running.link.unlink()
        running.link.symlink_to(checkpoints["2.0.0"])
        with Load(running.port, routes=PREDICTION_ROUTES) as load:
            load.wait_answers(16)
            os.kill(running.proc.pid, signal.SIGHUP)
            running.wait_for("rolling restart done", timeout=180)
            done = load.count()
            load.wait_answers(done + 16)
        assert load.check(padding_atol) == {"1.0.0", "2.0.0"}
        # every old replica was gone before the roll said done: whatever was answered after came from the new model
        assert {version for _, _, version, _ in load.answers[done:]} == {"2.0.0"}
        status, body, headers = get_json(f"http://127.0.0.1:{running.port}/info")
        assert status == 200 and body["model_version"] == headers["x-model-version"] == "2.0.0"
    first = {v: next(b for w, _, ver, b in load.answers if w == TEXTS[1] and ver == v) for v in ("1.0.0", "2.0.0")}
    assert first["1.0.0"]["probabilities"] != pytest.approx(first["2.0.0"]["probabilities"], abs=padding_atol), (
        "the two models agree"
    )


def test_a_port_taken_before_it_is_bound_is_replaced_by_another(checkpoints, tmp_path, monkeypatch, capsys):
    """serve-replicas picks its children's ports free and they bind them later (nginx cannot bind port 0 and say
    which port it got): a port another process takes in between is replaced, for a replica and for nginx."""
    if why := _nginx_missing():
        unavailable(f"nginx is not installed: {why}")
    from distrinews.serve.children import get_json
    from distrinews.serve.nginx import find_nginx
    from distrinews.serve.replicas import ReplicaSettings, Supervisor

    settings = ReplicaSettings(checkpoint=str(checkpoints["1.0.0"]), replicas=1, port=0, nginx=find_nginx(),
                               log_dir=str(tmp_path), serve_args=["--runtime", "torch"], ready_timeout=120)  # fmt: skip
    supervisor = Supervisor(settings)
    (replica,) = supervisor.replicas
    with socket.socket() as for_replica, socket.socket() as for_nginx:
        taken = []
        for held in (for_replica, for_nginx):
            held.bind(("127.0.0.1", 0))
            held.listen()
            taken.append(held.getsockname()[1])
        replica.port = taken[0]
        try:
            replica.start(settings.checkpoint)
            supervisor._wait_ready(replica, first_start=True)
            assert replica.port not in taken and replica.ready()
            free = supervisor._other_port
            picks = iter([taken[1]])
            monkeypatch.setattr(supervisor, "_other_port", lambda host="127.0.0.1": next(picks, None) or free(host))
            supervisor._start_nginx()
            assert supervisor.port not in taken and get_json(f"http://127.0.0.1:{supervisor.port}/ready")[0] == 200
        finally:
            supervisor._shutdown()
            shutil.rmtree(supervisor.temp, ignore_errors=True)
    said = capsys.readouterr().err
    assert f"replica 0: port {taken[0]} was taken; starting it on another" in said, said
    assert f"nginx: port {taken[1]} was taken; trying another" in said, said


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_replicas_comparison_runs_on_a_tiny_model(checkpoints, tmp_path, agnews_dir):
    if why := _nginx_missing():
        unavailable(f"nginx is not installed: {why}")
    out = tmp_path / "bench"
    args = [
        "--checkpoint",
        str(checkpoints["1.0.0"]),
        "--data",
        str(agnews_dir),
        "--runtime",
        "torch",
        "--threads",
        "2",
    ]
    # A row counts the answers to requests sent after the warm-up and answered before its end: a window of 1 s
    # (not 0.3) leaves room for a slow first answer on a loaded machine, or a row could count none.
    args += ["--concurrency", "1,2", "--duration", "1", "--warmup", "0.1", "--output", str(out)]
    result = subprocess.run([sys.executable, "-m", "benchmarks.tools.replicas", *args], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "replicas.json").read_text())
    rows = {(r["config"], r["concurrency"]): r for r in report["rows"]}
    assert set(rows) == {(c, n) for c in ("1x2 direct", "1x2 nginx", "2x1 nginx") for n in (1, 2)}
    failed = {key: {k: r[k] for k in ("requests", "errors", "rejected_429")} for key, r in rows.items()
              if not (r["requests"] > 0 and r["errors"] == 0)}  # fmt: skip
    assert not failed, failed
    # nginx's cost is the median latency through it less the median straight to the same replica, one client
    direct, proxied = rows["1x2 direct", 1], rows["1x2 nginx", 1]
    assert direct["p50_ms"] > 0 and proxied["p50_ms"] > 0
    assert report["nginx_overhead_p50_ms_at_1_client"] == pytest.approx(proxied["p50_ms"] - direct["p50_ms"])
    assert "| 2x1 nginx | 2 |" in (out / "replicas.md").read_text()

"""The REST API over real HTTP: a real ``distrinews serve`` (uvicorn) process on a free loopback port.

Servers: ``server`` (PyTorch, defaults but a 50 ms batching window and a 64 KiB body cap),
``strict_server`` (ONNX Runtime, API key, a queue of one text), and one per SIGTERM test.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

from conftest import await_until, unavailable, wait_until
from distrinews.distributed.lifetime import stop_processes

HEADLINES = [
    "Oil prices jump after OPEC agrees to cut production",
    "Federer beats Roddick to win his third Wimbledon title",
    "Apple unveils a new iPhone with a faster chip and a better camera",
    "UN Security Council meets over the crisis in Sudan",
]
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
API_KEY = "test-key-1234"


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def test_rows(agnews_dir):
    from distrinews.data.splits import load_split

    raw = load_split(agnews_dir, "test")
    return raw.texts[::19][:400]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, agnews_dir, spread_checkpoint):
    from distrinews.data.splits import load_split

    train = load_split(agnews_dir, "train")
    return spread_checkpoint(tmp_path_factory.mktemp("serve") / "best", train.texts[:256])


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory, server_process):
    srv = server_process(
        checkpoint,
        tmp_path_factory.mktemp("logs") / "server.log",
        "--runtime",
        "torch",
        "--max-wait-ms",
        "50",
        "--max-body-bytes",
        "65536",
    )
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def strict_server(checkpoint, tmp_path_factory, server_process):
    srv = server_process(
        checkpoint,
        tmp_path_factory.mktemp("logs") / "strict.log",
        "--runtime",
        "onnx",
        "--max-queue",
        "1",
        "--max-batch-size",
        "8",
        "--max-wait-ms",
        "0",
        env={"DISTRINEWS_API_KEY": API_KEY},
    )
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def default_server(checkpoint, tmp_path_factory, server_process):
    """``distrinews serve --checkpoint X`` and nothing else: the default runtime (made at start: no ONNX file beside
    X)."""
    srv = server_process(checkpoint, tmp_path_factory.mktemp("logs") / "default.log")
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _assert_prediction(p: dict) -> None:
    assert set(p) == {"label", "label_id", "confidence", "probabilities"}
    assert list(p["probabilities"]) == LABELS
    assert p["label"] == LABELS[p["label_id"]]
    assert p["confidence"] == pytest.approx(max(p["probabilities"].values()))
    assert sum(p["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)


# ---------------------------------------------------------------------- shapes and agreement
def test_every_endpoint_answers_with_the_documented_shape(server, padding_atol):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "healthy" and health.json()["model_loaded"] is True

        assert client.get("/ready").json() == {"status": "ready"}

        info = client.get("/info").json()
        assert info["labels"] == LABELS and info["max_length"] == 64 and info["runtime"] == "torch"
        assert info["model_name"] == "tiny-random-spread"
        assert info["batching"] == {
            "max_batch_size": 32,
            "max_batch_tokens": 512,
            "max_wait_ms": 50.0,
            "max_queue": 1024,
            "concurrent_passes": 1,  # PyTorch: one pass at a time on every core
        }
        assert info["limits"]["max_batch_texts"] == 64 and info["limits"]["max_body_bytes"] == 65536

        one = client.post("/predict", json={"text": HEADLINES[0]})
        assert one.status_code == 200 and one.headers["content-type"] == "application/json"
        _assert_prediction(one.json())

        batch = client.post("/predict/batch", json={"texts": HEADLINES})
        assert batch.status_code == 200
        assert len(batch.json()) == len(HEADLINES)
        for text, p in zip(HEADLINES, batch.json()):
            _assert_prediction(p)
            single = client.post("/predict", json={"text": text}).json()
            assert p["label"] == single["label"]  # in order, and batching does not change the answer
            assert p["probabilities"] == pytest.approx(single["probabilities"], abs=padding_atol)

        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        for name in (
            "distrinews_http_requests_total",
            "distrinews_http_request_duration_seconds_bucket",
            "distrinews_batch_size_bucket",
            "distrinews_queue_depth",
            "distrinews_model_loaded",
        ):
            assert name in metrics.text
        assert _metric(metrics.text, "distrinews_model_loaded") == 1.0
        assert 'distrinews_http_requests_total{method="POST",route="/predict",status="200"}' in metrics.text

        docs = client.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        schema = client.get("/openapi.json").json()
        body = schema["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert ["text"] in [shape.get("required") for shape in body["anyOf"]]  # the seed's shape, beside TEI's and HF's
        assert "/predict/batch" in schema["paths"]

        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'id="text"' in page.text and 'id="classify"' in page.text and 'href="docs"' in page.text


def test_predict_agrees_with_the_cli_and_with_transformers_pipeline(server, checkpoint, cli):
    from transformers import pipeline

    with httpx.Client(base_url=server.url, timeout=30) as client:
        served = [client.post("/predict", json={"text": t}).json() for t in HEADLINES]

    cli = json.loads(cli("predict", "--checkpoint", str(checkpoint), "--json", *HEADLINES).stdout)
    classifier = pipeline("text-classification", model=str(checkpoint), top_k=None, device="cpu")
    reference = classifier(HEADLINES)

    assert len({p["label"] for p in served}) > 1, "the test model should not give one label to everything"
    for s, c, ref in zip(served, cli, reference):
        assert s["label"] == c["label"]
        assert s["probabilities"] == pytest.approx(c["probabilities"], abs=1e-4)
        ref_probs = {r["label"]: r["score"] for r in ref}
        assert s["label"] == max(ref_probs, key=ref_probs.get)
        assert s["probabilities"] == pytest.approx(ref_probs, abs=1e-4)


def test_64_concurrent_requests_all_succeed_and_share_forward_passes(server, test_rows):
    before = httpx.get(server.url + "/metrics").text
    texts = test_rows[:64]

    async def burst():
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return await asyncio.gather(*(client.post("/predict", json={"text": t}) for t in texts))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 64
    for r in responses:
        _assert_prediction(r.json())
    with httpx.Client(base_url=server.url, timeout=30) as client:  # same answers one at a time
        alone = client.post("/predict/batch", json={"texts": texts}).json()
    assert [r.json()["label"] for r in responses] == [a["label"] for a in alone]

    after = httpx.get(server.url + "/metrics").text
    passes = _metric(after, "distrinews_batch_requests_count") - _metric(before, "distrinews_batch_requests_count")
    single = _metric(after, 'distrinews_batch_requests_bucket{le="1.0"}') - _metric(
        before, 'distrinews_batch_requests_bucket{le="1.0"}'
    )
    # 64 requests + the one /predict/batch: fewer forward passes than requests, some with several requests.
    assert passes - single >= 1, f"no forward pass coalesced two requests ({passes:.0f} passes)"
    assert passes < 65


# ---------------------------------------------------------------------- bad input
BAD_REQUESTS = [
    # (description, path, request kwargs, expected status, phrase in detail)
    ("empty text", "/predict", {"json": {"text": ""}}, 422, "empty"),
    ("whitespace-only text", "/predict", {"json": {"text": " \n\t  "}}, 422, "empty"),
    ("10,001 characters", "/predict", {"json": {"text": "a" * 10_001}}, 422, "10,000"),
    ("65 texts", "/predict/batch", {"json": {"texts": ["news"] * 65}}, 413, "limit is 64"),
    ("no texts", "/predict/batch", {"json": {"texts": []}}, 422, "empty"),
    ("an empty text in a batch", "/predict/batch", {"json": {"texts": ["fine", "  "]}}, 422, "texts[1]"),
    (
        "non-JSON",
        "/predict",
        {"content": b"text=hello", "headers": {"content-type": "application/json"}},
        422,
        "not valid JSON",
    ),
    (
        "truncated JSON",
        "/predict",
        {"content": b'{"text": "abc"', "headers": {"content-type": "application/json"}},
        422,
        "not valid JSON",
    ),
    ("empty body", "/predict", {"content": b"", "headers": {"content-type": "application/json"}}, 422, "empty"),
    ("a JSON array", "/predict", {"json": ["Oil prices jump"]}, 422, "JSON object"),
    ("text is a number", "/predict", {"json": {"text": 42}}, 422, "text: Input should be a valid string"),
    ("text is null", "/predict", {"json": {"text": None}}, 422, "valid string"),
    ("texts is a string", "/predict/batch", {"json": {"texts": "Oil prices jump"}}, 422, "valid list"),
    ("texts holds a number", "/predict/batch", {"json": {"texts": ["ok", 3]}}, 422, "texts.1"),
    ("missing field", "/predict", {"json": {"headline": "Oil prices jump"}}, 422, "text: Field required"),
    ("missing texts", "/predict/batch", {"json": {"text": "Oil prices jump"}}, 422, "texts: Field required"),
    (
        "invalid UTF-8",
        "/predict",
        {"content": b'{"text": "caf\xe9 \xff"}', "headers": {"content-type": "application/json"}},
        422,
        "UTF-8",
    ),
    (
        "unpaired surrogate",
        "/predict",
        {"content": b'{"text": "\\ud800 news"}', "headers": {"content-type": "application/json"}},
        422,
        "surrogate",
    ),
    ("oversized body", "/predict", {"json": {"text": "word " * 20_000}}, 413, "65,536 bytes"),
    (
        "oversized streamed body",
        "/predict",
        {"content": iter([b'{"text": "', b"x" * 70_000, b'"}']), "headers": {"content-type": "application/json"}},
        413,
        "too large",
    ),
    ("wrong method", "/predict", {"method": "GET"}, 405, "Method Not Allowed"),
    ("unknown route", "/nope", {"method": "GET"}, 404, "Not Found"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_input_gets_a_4xx_json_error_and_the_server_keeps_answering(server, case):
    _, path, kwargs, status, phrase = case
    kwargs = dict(kwargs)
    method = kwargs.pop("method", "POST")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/json"
        detail = response.json()["detail"]
        assert isinstance(detail, str) and phrase in detail
        # The same server still serves a good request afterwards.
        assert client.post("/predict", json={"text": HEADLINES[1]}).status_code == 200


def test_the_text_length_limits_are_inclusive(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/predict", json={"text": "a"}).status_code == 200
        assert client.post("/predict", json={"text": "  " + "a" * 10_000 + "  "}).status_code == 200
        assert client.post("/predict/batch", json={"texts": ["news"] * 64}).status_code == 200


def test_no_bad_input_ever_produced_a_500(server):
    # Sends every bad request itself, so it holds whichever tests ran before it (or none).
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for _, path, kwargs, status, _ in BAD_REQUESTS:
            kwargs = dict(kwargs)
            if not isinstance(kwargs.get("content", b""), bytes):
                continue  # a streamed body is a one-shot iterator, consumed by its own test
            assert client.request(kwargs.pop("method", "POST"), path, **kwargs).status_code == status
    text = httpx.get(server.url + "/metrics").text
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("distrinews_http_requests_total{") and 'status="4' in line
    )
    assert counted >= len(BAD_REQUESTS) - 1, "the metrics must have counted the bad requests"
    # (503 on /ready while the model loaded is by design; nothing else may be a 5xx.)
    server_errors = [
        line for line in text.splitlines() if line.startswith("distrinews_http_requests_total{") and 'status="5' in line
    ]
    assert all('route="/ready",status="503"' in line for line in server_errors), server_errors


# ---------------------------------------------------------------------- demo page in a real browser
class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fd 3 in, fd 4 out): no extra packages."""

    def __init__(self, binary: str, profile: str):
        import fcntl

        cmd_read, self._cmd_write = os.pipe()
        self._out_read, out_write = os.pipe()

        def wire_fds():  # runs in the child: its fd 3 reads our commands, fd 4 writes replies
            a = fcntl.fcntl(cmd_read, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(out_write, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1024,768",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # its own process group: Chromium's helpers (zygote, renderer, crashpad) are stopped with it in close()
        self.proc = subprocess.Popen(
            args,
            preexec_fn=wire_fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(cmd_read)
        os.close(out_write)
        self._buffer = b""
        self._next_id = 0
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._cmd_write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            ready, _, _ = select.select([self._out_read], [], [], left)
            if ready:
                chunk = os.read(self._out_read, 1 << 16)
                assert chunk, "Chromium closed the DevTools pipe"
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(); "
            "return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}
            )

    def close(self) -> None:
        try:
            os.close(self._cmd_write)
            os.close(self._out_read)
        finally:
            stop_processes(self.proc, grace_s=10)
            # The helpers outlive the main process for a moment and go on writing into the profile, which
            # made the profile's removal fail now and then ("Directory not empty: 'Default'"): stop them all.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                time.sleep(0.05)


def test_demo_page_shows_a_prediction_after_typing_and_clicking(server):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        unavailable("Chromium is not installed (apt-get install chromium; .ci/run does this)")
    headline = HEADLINES[2]
    expected = httpx.post(server.url + "/predict", json={"text": headline}, timeout=30).json()
    with tempfile.TemporaryDirectory(prefix="distrinews-chromium-") as profile:
        browser = Chromium(binary, profile)
        try:
            target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            browser.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            browser.send("Page.navigate", {"url": server.url + "/"})
            wait_until(
                lambda: browser.evaluate("document.readyState === 'complete' && !!document.getElementById('classify')"),
                30,
                "the page to load",
            )
            assert browser.evaluate("document.querySelector('a[href=\"docs\"]') !== null")

            browser.click("#text")  # focus the box like a user, then type into it
            browser.send("Input.insertText", {"text": headline})
            assert browser.evaluate("document.getElementById('text').value") == headline
            browser.click("#classify")

            shown = wait_until(
                lambda: browser.evaluate("document.getElementById('label').dataset.label || ''"),
                30,
                "a prediction on the page",
            )
            bars = browser.evaluate(
                "[...document.querySelectorAll('#bars .bar')].map(b => "
                "[b.children[0].textContent, b.querySelector('.fill').style.width])"
            )
            error = browser.evaluate("document.getElementById('error').textContent")
        finally:
            browser.close()
    assert error == ""
    assert shown == expected["label"]
    assert sorted(name for name, _ in bars) == sorted(LABELS)
    widths = {name: float(width.rstrip("%")) for name, width in bars}
    assert widths[expected["label"]] == pytest.approx(100 * expected["confidence"], abs=0.06)


# ---------------------------------------------------------------------- auth, ONNX runtime, back-pressure
def test_api_key_guards_every_route_but_the_page_and_the_probes(strict_server):
    url = strict_server.url
    with httpx.Client(base_url=url, timeout=30) as client:
        for path in ("/", "/health", "/ready"):
            assert client.get(path).status_code == 200, path
        for method, path in (
            ("POST", "/predict"),
            ("POST", "/predict/batch"),
            ("GET", "/info"),
            ("GET", "/metrics"),
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
        ):
            kwargs = {"json": {"text": "x"}} if method == "POST" else {}
            missing = client.request(method, path, **kwargs)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer" in missing.json()["detail"]
            wrong = client.request(method, path, headers={"Authorization": "Bearer not-the-key"}, **kwargs)
            assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid API key"
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert client.post("/predict", json={"text": HEADLINES[0]}, headers=auth).status_code == 200
        assert client.get("/info", headers=auth).status_code == 200
        assert 'status="401"' in client.get("/metrics", headers=auth).text


def test_onnx_runtime_serves_the_same_labels_as_pytorch(server, strict_server, test_rows):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    info = httpx.get(strict_server.url + "/info", headers=auth).json()
    assert info["runtime"] == "onnx" and info["onnx_quantized"] is False
    rows = test_rows[:64]
    torch_results = httpx.post(server.url + "/predict/batch", json={"texts": rows}, timeout=60).json()
    response = httpx.post(strict_server.url + "/predict/batch", json={"texts": rows}, headers=auth, timeout=60)
    assert response.status_code == 200, response.text
    onnx_results = response.json()
    assert [r["label"] for r in onnx_results] == [r["label"] for r in torch_results]
    for o, t in zip(onnx_results, torch_results):
        assert o["probabilities"] == pytest.approx(t["probabilities"], abs=1e-3)


def test_a_saturated_server_answers_429_and_recovers(strict_server):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    # Long texts make each forward pass slow enough that the single queue slot fills.
    body = {"texts": [("Markets rally as investors cheer earnings " * 230)[:9_000]] * 8}

    async def burst():
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
        async with httpx.AsyncClient(base_url=strict_server.url, timeout=120, limits=limits, headers=auth) as client:
            return await asyncio.gather(*(client.post("/predict/batch", json=body) for _ in range(40)))

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1, "40 concurrent slow requests never filled a one-text queue"
    assert statuses.count(200) >= 1
    rejected = next(r for r in responses if r.status_code == 429)
    assert "retry" in rejected.json()["detail"] and rejected.headers["retry-after"] == "1"
    # Once the burst is over the server serves again.
    assert httpx.post(strict_server.url + "/predict", json={"text": HEADLINES[0]}, headers=auth).status_code == 200


def test_the_default_runtime_is_the_one_serve_help_names_and_it_serves(default_server, checkpoint, cli):
    from distrinews.predict.runtimes import DEFAULT_RUNTIME

    help_text = " ".join(cli("serve", "--help").stdout.split())
    assert f"(default: {DEFAULT_RUNTIME};" in help_text
    assert DEFAULT_RUNTIME == "auto"
    with httpx.Client(base_url=default_server.url, timeout=30) as client:
        info = client.get("/info").json()
        choice = info["runtime_choice"]
        assert choice["requested"] == "auto" and choice["reason"]
        assert info["runtime"] == choice["runtime"]
        # The rule's verdict is the check recorded in the int8 file it made at this first start, kept in the cache.
        import onnxruntime

        from distrinews.predict.derived import INT8_FILE, DerivedFiles
        from distrinews.predict.int8 import read_check

        made = DerivedFiles(checkpoint).read(INT8_FILE)
        assert made is not None and not (checkpoint / INT8_FILE).exists(), "made into the cache, not the checkpoint"
        recorded = read_check(onnxruntime.InferenceSession(str(made.path), providers=["CPUExecutionProvider"]))
        assert recorded == choice["check"]
        assert info["runtime"] == ("onnx-int8" if recorded["passed"] else "torch")
        assert info.get("onnx_quantized", False) is recorded["passed"]
        one = client.post("/predict", json={"text": HEADLINES[0]})
        assert one.status_code == 200
        _assert_prediction(one.json())
        batch = client.post("/predict/batch", json={"texts": HEADLINES})
        assert batch.status_code == 200 and len(batch.json()) == len(HEADLINES)


def test_a_client_that_hangs_up_while_queued_is_never_computed(checkpoint, tmp_path, server_process):
    # One text per forward pass: the blockers below keep the model busy for hundreds of passes.
    srv = server_process(checkpoint, tmp_path / "gone.log", "--runtime", "torch", "--max-batch-size", "1").wait_ready()
    blockers_n = 10
    try:
        long_texts = [
            f"{i} " + "Stocks fell sharply on Wall Street as investors weighed new data " * 8 for i in range(64)
        ]

        def metric(name: str) -> float:
            return _metric(httpx.get(srv.url + "/metrics", timeout=30).text, name)

        dropped_at_start, computed_at_start = (
            metric("distrinews_requests_dropped_total"),
            metric("distrinews_batch_size_sum"),
        )

        async def scenario():
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                blockers = [
                    asyncio.ensure_future(client.post("/predict/batch", json={"texts": long_texts}))
                    for _ in range(blockers_n)
                ]
                # the model runs one, the others wait
                queued = (blockers_n - 1) * 64
                await await_until(lambda: metric("distrinews_queue_depth") >= queued, 120, "the blockers queued", 0.01)
                # A raw client: sends its request, waits until the server has queued it, then hangs up.
                _, writer = await asyncio.open_connection("127.0.0.1", srv.port)
                body = json.dumps({"text": "a request nobody waits for"}).encode()
                head = (
                    "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
                # blockers move the depth in steps of 64 texts
                await await_until(lambda: metric("distrinews_queue_depth") % 64 == 1, 120, "the raw request queued")
                dropped_while_queued = metric("distrinews_requests_dropped_total")
                still_busy = not blockers[-1].done()
                writer.close()
                await writer.wait_closed()
                return await asyncio.gather(*blockers), dropped_while_queued, still_busy

        responses, dropped_while_queued, still_busy = asyncio.run(scenario())
        assert still_busy, "the blockers finished before the client hung up: the test proved nothing"
        assert [r.status_code for r in responses] == [200] * blockers_n
        assert dropped_while_queued == dropped_at_start == 0
        # The last blocker can be answered before the batcher reaches the hung-up request behind it: wait for
        # the drop to be counted rather than read the counter at once.
        wait_until(lambda: metric("distrinews_requests_dropped_total") >= 1, 60, "the hung-up request dropped")
        assert metric("distrinews_requests_dropped_total") == 1
        computed = metric("distrinews_batch_size_sum") - computed_at_start
        assert computed == blockers_n * 64, (
            f"{computed:.0f} texts computed: the hung-up request's text must not be one of them"
        )
    finally:
        srv.stop()


# ---------------------------------------------------------------------- graceful shutdown
def test_sigterm_answers_every_in_flight_request_then_exits_0(checkpoint, tmp_path, server_process):
    srv = server_process(checkpoint, tmp_path / "drain.log").wait_ready()
    # Each request is 32 texts of 10,000 characters: slow to tokenize, so several are still
    # queued behind the first when SIGTERM arrives.
    texts = [
        (f"{i} " + "Stocks fell sharply on Wall Street today as investors weighed new data " * 150)[:10_000]
        for i in range(32)
    ]
    results: list[tuple[int | str, int]] = []
    lock = threading.Lock()
    first_done = threading.Event()

    def client(i: int) -> None:
        try:
            response = httpx.post(srv.url + "/predict/batch", json={"texts": texts}, timeout=120)
            status, n = response.status_code, len(response.json()) if response.status_code == 200 else -1
        except httpx.HTTPError as exc:  # a dropped request is what this test must never see
            status, n = f"{type(exc).__name__}: {exc}", -1
        with lock:
            results.append((status, n))
        first_done.set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        assert first_done.wait(120), "no request finished"
        with lock:
            srv.proc.send_signal(signal.SIGTERM)
            done_at_sigterm = len(results)
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads), f"a client still waits 180 s after SIGTERM\n{srv.log()}"
        code = srv.proc.wait(60)
    finally:
        srv.stop()
    assert [r[0] for r in results] == [200] * 8, f"{results}\n{srv.log()}"
    assert all(n == 32 for _, n in results)
    assert done_at_sigterm < 8, "no request was in flight at SIGTERM: the test proved nothing"
    assert code == 0, srv.log()
    log = srv.log()
    assert "Shutting down" in log and "Finished server process" in log


# ---------------------------------------------------------------------- command line
def test_serve_without_a_checkpoint_says_what_to_do(tmp_path):
    env_free = {k: v for k, v in os.environ.items() if k != "MODEL_CHECKPOINT"}
    proc = subprocess.run(
        [sys.executable, "-m", "distrinews", "serve"], capture_output=True, text=True, env=env_free, timeout=120
    )
    assert proc.returncode == 2 and "MODEL_CHECKPOINT" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "distrinews", "serve", "--checkpoint", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr

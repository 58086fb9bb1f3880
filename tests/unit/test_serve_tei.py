"""text-embeddings-inference's and Hugging Face's shapes on /predict, in process: answers, errors (TEI's body and
status codes), timing headers, the routes' declared errors; and the remote client's retries against a real server."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import TEI_TIMING_HEADERS as TIMING
from conftest import await_until, served, wait_until
from distrinews.predict.client import RemoteClassifier, RemoteError, retry_after
from distrinews.serve.app import ServeConfig, create_app
from distrinews.serve.tei import ERROR_TYPES, LOG_OF_ZERO

LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def _wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def predictor(fake_predictor):
    return fake_predictor()


@pytest.fixture(scope="module")
def client(predictor):
    app = create_app(
        ServeConfig(checkpoint="unused", api_key="", max_batch_texts=3), predictor_factory=lambda: predictor
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        _wait_ready(c)
        yield c


def _ranked(answer) -> None:
    """Every label once, with its score, highest first."""
    assert sorted(p["label"] for p in answer) == sorted(LABELS)
    assert all(set(p) == {"label", "score"} for p in answer)
    scores = [p["score"] for p in answer]
    assert scores == sorted(scores, reverse=True)


# ---------------------------------------------------------------------- answers
def test_tei_and_hugging_face_requests_are_answered_in_their_shapes_on_every_route(client, predictor):
    for path in ("/predict", "/", "/invocations"):
        one = client.post(path, json={"inputs": "Oil prices jump"})
        assert one.status_code == 200, one.text
        _ranked(one.json())
        assert one.json()[0] == {"label": "World", "score": 1.0}
    assert client.post("/predict", json={"inputs": ["Oil prices jump"]}).json() == one.json()  # TEI: [text] is one text

    batch = client.post(
        "/predict", json={"inputs": [["Oil prices jump"], ["Federer wins"]], "truncate": True, "raw_scores": False}
    )
    assert batch.status_code == 200 and len(batch.json()) == 2
    for answer in batch.json():
        _ranked(answer)

    # Hugging Face: a list per input (InferenceClient reads the first), top_k cuts it.
    hf = client.post("/predict", json={"inputs": "Oil prices jump", "parameters": {}})
    assert hf.status_code == 200 and hf.json() == [one.json()]
    top = client.post(
        "/predict", json={"inputs": ["a", "b"], "parameters": {"top_k": 2, "function_to_apply": "softmax"}}
    ).json()
    assert top == [one.json()[:2]] * 2

    # Scores before softmax: log-probabilities (the logits up to a constant per text); 0 has the smallest float's log.
    raw = client.post("/predict", json={"inputs": "x", "raw_scores": True}).json()
    assert raw[0] == {"label": "World", "score": 0.0} and {p["score"] for p in raw[1:]} == {LOG_OF_ZERO}
    assert client.post("/predict", json={"inputs": "x", "parameters": {"function_to_apply": "none"}}).json() == [raw]

    # The seed's shape, unchanged, beside them: "text" wins over "inputs".
    seed = client.post("/predict", json={"text": "Oil prices jump", "inputs": "ignored"})
    assert set(seed.json()) == {"label", "label_id", "confidence", "probabilities"}


def test_every_prediction_answer_carries_teis_timing_headers(client):
    answers = [
        client.post("/predict", json={"text": "Oil prices jump after OPEC cuts output"}),
        client.post("/predict/batch", json={"texts": ["Oil prices jump after OPEC cuts output", "Federer wins"]}),
        client.post("/predict", json={"inputs": [["Oil prices jump after OPEC cuts output"], ["Federer wins"]]}),
    ]
    for response in answers:
        assert response.status_code == 200
        for name in TIMING:
            assert response.headers[name].isdigit(), (name, response.headers)
        assert int(response.headers["x-total-time"]) >= int(response.headers["x-inference-time"])
        assert response.headers["x-compute-type"] == "fake"
    # The tokens are the texts' own, counted by the batcher: [CLS] oil prices jump after opec cuts [SEP] (8, the
    # fake model's max_length), then [CLS] federer wins [SEP] (4 or more: the name may take several word pieces).
    assert int(answers[0].headers["x-compute-tokens"]) == 8
    assert int(answers[1].headers["x-compute-tokens"]) == int(answers[2].headers["x-compute-tokens"]) >= 12
    assert answers[0].headers["x-compute-characters"] == str(len("Oil prices jump after OPEC cuts output"))


def test_the_timing_headers_are_the_batchers_measurements(fake_predictor):
    """A forward pass held for 60 ms shows in x-inference-time, and a request queued behind it in x-queue-time
    (lower bounds: what the test imposed, not how fast anything is)."""
    held = threading.Event()

    class Slow(fake_predictor):
        def predict_encoded(self, batch):
            time.sleep(0.06)
            held.set()
            return super().predict_encoded(batch)

    app = create_app(
        ServeConfig(checkpoint="unused", api_key="", max_batch_size=1, max_wait_ms=0), predictor_factory=Slow
    )
    with TestClient(app) as c:
        _wait_ready(c)
        first = threading.Thread(target=c.post, args=("/predict",), kwargs={"json": {"text": "first"}})
        first.start()
        second = c.post("/predict", json={"inputs": "second"})
        first.join(10)
    assert int(second.headers["x-inference-time"]) >= 60
    assert int(second.headers["x-total-time"]) >= int(second.headers["x-queue-time"]) + int(
        second.headers["x-inference-time"]
    )
    assert held.is_set()


def test_truncation_false_refuses_a_long_text_and_left_keeps_its_end(client, predictor):
    long = "one two three four five six seven eight nine ten"
    refused = client.post("/predict", json={"inputs": long, "truncate": False})
    assert refused.status_code == 422
    too_long = "Input validation error: `inputs` must have less than 8 tokens. Given: 12"
    assert refused.json() == {"error": too_long, "error_type": "Validation"}
    assert client.post("/predict", json={"inputs": "one two", "truncate": False}).status_code == 200

    predictor.computed.clear()
    for direction in ("left", "Left", "right", "Right"):
        assert client.post("/predict", json={"inputs": long, "truncation_direction": direction}).status_code == 200
    # 8 tokens: [CLS] and [SEP] around the last six words (left), or the first six (right).
    assert predictor.computed == ["five six seven eight nine ten"] * 2 + ["one two three four five six"] * 2


class _Counting:
    """A ``tokenizers.Tokenizer`` that records how many texts each of its encode calls took."""

    def __init__(self, inner, calls: list[int]):
        self._inner, self._calls = inner, calls

    def encode_batch(self, texts, *args, **kwargs):
        self._calls.append(len(texts))
        return self._inner.encode_batch(texts, *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self._calls.append(1)
        return self._inner.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_teis_truncation_options_tokenize_after_admission_and_each_text_once(fake_predictor):
    """``truncate: false`` and ``truncation_direction: left`` need a text's length in tokens. A request the full
    queue refuses (429) costs no tokenizer call, as TEI takes its permit before tokenizing; an admitted one is
    tokenized once, text by text, where every request's texts are."""
    running, gate, calls = threading.Event(), threading.Event(), []

    class Counted(fake_predictor):
        def __init__(self):
            super().__init__()
            whole = self.encoder._whole  # the copy that never truncates, made before the tokenizer is wrapped
            self.encoder.tokenizer = _Counting(self.encoder.tokenizer, calls)
            self.encoder.__dict__["_whole"] = _Counting(whole, calls)

        def predict_encoded(self, batch):
            running.set()
            assert gate.wait(10)
            return super().predict_encoded(batch)

    predictor = Counted()
    config = ServeConfig(checkpoint="unused", api_key="", max_queue=1, max_batch_size=1, max_wait_ms=0)
    app = create_app(config, predictor_factory=lambda: predictor)
    long = "one two three four five six seven eight nine ten"

    async def main():
        async with served(app, base_url="http://t") as c:
            first = asyncio.ensure_future(c.post("/predict", json={"text": "keeps the model busy"}))
            await await_until(running.is_set, 30, "the first request in the forward pass", 0.001)
            queued = asyncio.ensure_future(c.post("/predict", json={"text": "waits"}))
            batcher = app.state.serve.batcher
            queued_up = lambda: batcher.queue_depth >= 1 and not batcher._tokenizing  # noqa: E731
            await await_until(queued_up, 30, "the second request queued", 0.001)
            calls.clear()
            refused = [
                await c.post("/predict", json={"inputs": [[long]] * 3, "truncate": False}),
                await c.post("/predict", json={"inputs": [[long]] * 3, "truncation_direction": "left"}),
            ]
            calls_refused = list(calls)
            gate.set()
            await asyncio.gather(first, queued)
            calls.clear()
            too_long = await c.post("/predict", json={"inputs": [["one two"], [long]], "truncate": False})
            calls_too_long = list(calls)
            calls.clear()
            predictor.computed.clear()
            left = await c.post("/predict", json={"inputs": [["one two"], [long]], "truncation_direction": "Left"})
            return refused, calls_refused, too_long, calls_too_long, left, list(calls)

    refused, calls_refused, too_long, calls_too_long, left, calls_left = asyncio.run(main())
    assert [r.status_code for r in refused] == [429, 429] and refused[0].json()["error_type"] == "Overloaded"
    assert calls_refused == [], "a request the queue refused was tokenized"
    assert too_long.status_code == 422 and too_long.json() == {
        "error": "Input validation error: `inputs` must have less than 8 tokens. Given: 12",
        "error_type": "Validation",
    }
    assert calls_too_long == [2], f"tokenizer calls (texts each): {calls_too_long}"
    assert left.status_code == 200, left.text
    assert calls_left == [2], f"tokenizer calls (texts each): {calls_left}"
    assert predictor.computed == ["one two", "five six seven eight nine ten"]


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("body", "status", "error_type", "phrase"),
    [
        ({"inputs": ["a", "b"]}, 422, "Validation", "text pairs are not supported"),
        ({"inputs": [["a"], ["a", "b"]]}, 422, "Validation", "`inputs[1]`: text pairs are not supported"),
        ({"inputs": ["a", "b", "c"]}, 422, "Validation", "`inputs` has 3 strings"),
        ({"inputs": [["a"], "b"]}, 422, "Validation", "`inputs[1]` must be"),
        ({"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
        ({"inputs": "  "}, 400, "Empty", "`inputs` cannot be empty"),
        ({"inputs": [["a"], [""]]}, 400, "Empty", "`inputs[1][0]` cannot be empty"),
        ({"inputs": [["a"]] * 4}, 413, "Validation", "batch size 4 > maximum allowed batch size 3"),
        ({"inputs": ["a"] * 4, "parameters": {}}, 413, "Validation", "batch size 4 > maximum allowed batch size 3"),
        ({"inputs": 5}, 422, "Validation", "`inputs` must be a string"),
        ({"inputs": "x" * 10_001}, 422, "Validation", "the limit is 10,000"),
        ({"inputs": "a", "raw_scores": "yes"}, 422, "Validation", "`raw_scores` must be true or false"),
        ({"inputs": "a", "truncate": 1}, 422, "Validation", "`truncate` must be"),
        ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation", "`truncation_direction` must be"),
        ({"inputs": "a", "parameters": {"top_k": 0}}, 422, "Validation", "`parameters.top_k` must be"),
        ({"inputs": "a", "parameters": {"function_to_apply": "sigmoid"}}, 422, "Validation", "single-label"),
        ({"inputs": "a", "parameters": {"temperature": 1}}, 422, "Validation", "`parameters` has 'temperature', which"),
        ({"inputs": "a", "parameters": []}, 422, "Validation", "`parameters` must be an object"),
    ],
)
def test_requests_in_teis_shape_get_teis_errors(client, body, status, error_type, phrase):
    response = client.post("/predict", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"} and response.json()["error_type"] == error_type
    assert phrase in response.json()["error"]


HUGE = "x" * (3 * 1024 * 1024)  # under --max-body-bytes: the body is read, then refused for this value


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/predict", {"json": {"inputs": "a", "truncation_direction": HUGE}}, 422),
        ("POST", "/", {"json": {"inputs": "a", "parameters": {"top_k": HUGE}}}, 422),
        ("POST", "/invocations", {"json": {"inputs": "a", "parameters": {"function_to_apply": HUGE}}}, 422),
        ("POST", "/predict", {"json": {"inputs": "a", "parameters": {HUGE: 1}}}, 422),
        ("POST", "/predict", {"json": {"inputs": "a", "parameters": {"top_k": [0] * 100_000}}}, 422),
        ("POST", "/predict/batch", {"content": b"{}", "headers": {"content-type": HUGE}}, 415),
        ("POST", "/predict", {"content": b"{}", "headers": {"content-length": HUGE}}, 400),
    ],
)
def test_an_error_quotes_at_most_a_short_prefix_of_what_the_client_sent(client, method, path, kwargs, status):
    """A client's megabytes are never echoed back: an answer it need not read would hold them in the server."""
    response = client.request(method, path, **kwargs)
    assert response.status_code == status, response.text[:200]
    assert len(response.content) < 1024, f"{len(response.content):,}-byte answer: {response.text[:200]}"
    assert "xxxxxxxxxx" in response.text or "100,000 items" in response.text  # still recognisable


def test_a_quoted_value_says_how_long_it_was():
    from distrinews.serve.schemas import QUOTED_CHARS, quoted

    assert quoted("left-ish") == "'left-ish'" and quoted(7) == "7" and quoted(None) == "None"
    assert quoted("y" * 5000) == repr("y" * QUOTED_CHARS) + "... (5,000 characters)"
    assert quoted(10**90) == f"'{str(10**90)[:QUOTED_CHARS]}'... (91 characters)"
    assert quoted([1, 2, 3]) == "an array of 3 items" and quoted({"a": 1}) == "an object of 1 keys"


def test_seed_requests_keep_the_seed_errors(client):
    response = client.post("/predict", json={"text": ""})
    assert response.status_code == 422 and set(response.json()) == {"detail"}
    response = client.post("/", content=b"[1]", headers={"content-type": "application/json"})  # no shape to tell
    assert response.status_code == 422 and "detail" in response.json()


def test_teis_errors_while_loading_when_busy_and_when_the_model_fails(fake_predictor):
    loaded, busy_gate, running = threading.Event(), threading.Event(), threading.Event()

    class Gated(fake_predictor):
        def predict_encoded(self, batch):
            if "boom" in self.encoder.tokenizer.decode(batch[0].ids.tolist()):
                raise RuntimeError("the forward pass failed")
            running.set()
            assert busy_gate.wait(10)
            return super().predict_encoded(batch)

    def load():
        assert loaded.wait(10)
        return Gated()

    app = create_app(
        ServeConfig(checkpoint="unused", api_key="", max_queue=1, max_batch_size=1, max_wait_ms=0),
        predictor_factory=load,
    )

    async def main():
        async with served(app, ready=False, base_url="http://t") as c:
            loading = await c.post("/predict", json={"inputs": "a"})
            seed_loading = await c.post("/predict", json={"text": "a"})
            loaded.set()

            async def ready():
                return (await c.get("/ready")).status_code == 200

            await await_until(ready, 30, "the model loaded", 0.01)
            first = asyncio.ensure_future(c.post("/predict", json={"text": "keeps the model busy"}))
            await await_until(running.is_set, 30, "the first request in the forward pass", 0.001)
            queued = asyncio.ensure_future(c.post("/predict", json={"text": "waits"}))
            batcher = app.state.serve.batcher
            queued_up = lambda: batcher.queue_depth >= 1 and not batcher._tokenizing  # noqa: E731
            await await_until(queued_up, 30, "the second request queued", 0.001)
            full = await c.post("/predict", json={"inputs": "one too many"})
            busy_gate.set()
            await asyncio.gather(first, queued)
            failed = await c.post("/predict", json={"inputs": "boom boom boom"})
            return loading, seed_loading, full, failed

    loading, seed_loading, full, failed = asyncio.run(main())
    assert (
        loading.status_code == 503
        and loading.json()["error_type"] == "Unhealthy"
        and loading.headers["retry-after"] == "1"
    )
    assert seed_loading.status_code == 503 and "detail" in seed_loading.json()
    assert full.status_code == 429 and full.json()["error_type"] == "Overloaded" and full.headers["retry-after"] == "1"
    assert failed.status_code == 424 and failed.json() == {
        "error": "Backend error: inference failed (the server log has the details)",
        "error_type": "Backend",
    }


def test_post_on_the_public_page_still_needs_the_api_key(fake_predictor):
    app = create_app(ServeConfig(checkpoint="unused", api_key="k"), predictor_factory=fake_predictor)
    with TestClient(app) as c:
        assert c.get("/").status_code == 200 and c.get("/health").status_code == 200
        assert c.post("/", json={"inputs": "a"}).status_code == 401
        assert c.post("/invocations", json={"inputs": "a"}).status_code == 401
        _wait_ready(c)
        assert c.post("/", json={"inputs": "a"}, headers={"Authorization": "Bearer k"}).status_code == 200


# ---------------------------------------------------------------------- the OpenAPI document
def test_every_route_declares_its_errors_with_an_example_and_the_configured_limit(fake_predictor):
    app = create_app(ServeConfig(checkpoint="unused", api_key="k", max_batch_texts=7), predictor_factory=fake_predictor)
    schema = app.openapi()
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            errors = {code: r for code, r in operation["responses"].items() if code[0] in "45"}
            assert errors, f"{method} {path} declares no error"
            for code, response in errors.items():
                examples = response["content"]["application/json"]["examples"]
                assert examples, (path, code)
                for example in examples.values():
                    value = example["value"]
                    if "error_type" in value:  # TEI's body, with the type TEI gives this status
                        assert value["error_type"] == ERROR_TYPES.get(int(code), "Validation"), (path, code)
                    else:
                        assert isinstance(value.get("detail", value.get("error")), str), (path, code)
    batch = schema["paths"]["/predict/batch"]["post"]
    assert batch["summary"] == "classify up to 7 texts, results in order"
    assert "64" not in json.dumps(batch["requestBody"])
    predict = schema["paths"]["/predict"]["post"]
    shapes = predict["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert [s["title"] for s in shapes] == [
        "PredictRequest",
        "TEI PredictRequest",
        "Hugging Face text-classification request",
    ]
    assert set(predict["responses"]) == {"200", "400", "401", "413", "415", "422", "424", "429", "503"}
    for path in ("/", "/invocations"):
        assert set(schema["paths"][path]["post"]["responses"]) == set(predict["responses"])
    assert set(schema["paths"]["/"]) == {"post"}  # GET / is the page, outside the API document


# ---------------------------------------------------------------------- the remote client
def test_retry_after_reads_seconds_and_dates():
    assert retry_after("3", 0) == 3.0
    assert retry_after(None, 0) == 0.5 and retry_after(None, 2) == 2.0 and retry_after("soon", 1) == 1.0
    assert 0 < retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 5)), 0) <= 5
    # "-0000" is RFC 5322's date of unknown zone: parsed without one, it cannot be compared with now (a TypeError
    # that once escaped the client); the backoff is used instead
    assert retry_after(time.strftime("%a, %d %b %Y %H:%M:%S -0000", time.gmtime(time.time() + 5)), 1) == 1.0


def test_the_client_gives_up_at_once_on_a_wait_longer_than_allowed_and_on_other_errors():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/predict":
            return httpx.Response(429, json={"detail": "server busy"}, headers={"Retry-After": "3600"})
        return httpx.Response(422, json={"error": "bad", "error_type": "Validation"})

    with RemoteClassifier("http://server", transport=httpx.MockTransport(handler), max_retry_wait=10) as remote:
        with pytest.raises(RemoteError, match="retry in 3600 s") as busy:
            remote.predict("a")
        assert busy.value.status == 429 and calls == ["/predict"]
        with pytest.raises(RemoteError, match="HTTP 422: bad"):
            remote.info()


class _ThreadServer:
    """The app under a real uvicorn on a loopback port, in a thread of this process (a controllable predictor)."""

    def __init__(self, app):
        import uvicorn

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        # Listening before the server runs: a client that connects first waits in the backlog rather than being
        # refused (uvicorn calls listen() only once its thread has started, late on loaded cores).
        self.socket.listen()
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.socket.close()


def test_the_thread_server_answers_a_client_that_connects_before_its_thread_runs(fake_predictor):
    """The harness itself: on loaded cores the client's first request can come before uvicorn's thread starts."""
    app = create_app(ServeConfig(checkpoint="unused"), predictor_factory=fake_predictor)
    server = _ThreadServer(app)
    threading.Timer(0.3, server.thread.start).start()  # the thread late, as under load
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/health").status_code == 200
    finally:
        wait_until(server.thread.is_alive, 10, "the server's thread")
        server.__exit__(None, None, None)


class _OnRetry(logging.Handler):
    """Calls ``action`` at the client's first retry (its log line), and records every retry's line."""

    def __init__(self, action):
        super().__init__()
        self.action, self.lines = action, []

    def emit(self, record):
        self.lines.append(record.getMessage())
        self.action()


def test_the_remote_client_retries_a_503_and_a_429_after_retry_after(fake_predictor):
    loaded, busy_gate, running = threading.Event(), threading.Event(), threading.Event()

    class Gated(fake_predictor):
        def predict_encoded(self, batch):
            running.set()
            assert busy_gate.wait(10)
            return super().predict_encoded(batch)

    def load():
        assert loaded.wait(10)
        return Gated()

    config = ServeConfig(checkpoint="unused", api_key="secret", max_queue=1, max_batch_size=1, max_wait_ms=0)
    app = create_app(config, predictor_factory=load)
    logger = logging.getLogger("distrinews.predict.client")
    logger.setLevel(logging.INFO)
    with _ThreadServer(app) as server, RemoteClassifier(server.url, api_key="secret") as remote:
        # 503 while the model loads: the client waits Retry-After (1 s) and finds it loaded.
        handler = _OnRetry(loaded.set)
        logger.addHandler(handler)
        try:
            busy_gate.set()
            assert remote.predict("Oil prices jump")["label"] == "World"
        finally:
            logger.removeHandler(handler)
        assert len(handler.lines) == 1 and "HTTP 503; retrying in 1.00 s" in handler.lines[0]

        # 429: one request in the forward pass, one in the queue (max_queue 1); ours is one too many.
        busy_gate.clear()
        running.clear()
        with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer secret"}, timeout=30) as other:
            busy = threading.Thread(target=other.post, args=("/predict",), kwargs={"json": {"text": "busy"}})
            busy.start()
            assert running.wait(10)
            queued = threading.Thread(target=other.post, args=("/predict",), kwargs={"json": {"text": "queued"}})
            queued.start()
            batcher = app.state.serve.batcher
            wait_until(lambda: batcher.queue_depth >= 1 and not batcher._tokenizing, 30, "the second request queued",
                       interval=0.001)  # fmt: skip
            handler = _OnRetry(busy_gate.set)
            logger.addHandler(handler)
            try:
                assert remote.predict(["Oil prices jump", "Federer wins"]) == [remote.predict("a")] * 2
            finally:
                logger.removeHandler(handler)
                busy_gate.set()
                busy.join(10)
                queued.join(10)
        assert len(handler.lines) == 1 and "HTTP 429; retrying in 1.00 s" in handler.lines[0]

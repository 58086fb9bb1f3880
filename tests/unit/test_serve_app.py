"""The app in process with controllable predictors: 503 while loading, 200 after, 503 if loading fails; a client that
hangs up while its request is queued is never computed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import httpx
import pytest

from conftest import await_until, served
from distrinews.serve.app import ServeConfig, create_app


async def _poll(client: httpx.AsyncClient, path: str, status: int, timeout: float = 10.0) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        response = await client.get(path)
        if response.status_code == status or loop.time() > deadline:
            return response
        await asyncio.sleep(0.01)


def test_ready_and_predict_say_503_until_the_model_has_loaded(fake_predictor):
    gate = threading.Event()

    def slow_loader():
        assert gate.wait(10)
        return fake_predictor()

    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=slow_loader)

    async def main():
        async with served(app, ready=False) as client:
            health = await client.get("/health")
            assert health.status_code == 200 and health.json()["model_loaded"] is False
            ready = await client.get("/ready")
            assert ready.status_code == 503 and "loading" in ready.json()["detail"]
            predict = await client.post("/predict", json={"text": "Oil prices jump"})
            assert predict.status_code == 503 and predict.headers["retry-after"] == "1"
            assert "distrinews_model_loaded 0.0" in (await client.get("/metrics")).text

            gate.set()
            assert (await _poll(client, "/ready", 200)).status_code == 200
            predict = await client.post("/predict", json={"text": "Oil prices jump"})
            assert predict.status_code == 200 and predict.json()["label"] == "World"
            assert (await client.get("/health")).json()["model_loaded"] is True
            assert "distrinews_model_loaded 1.0" in (await client.get("/metrics")).text

    asyncio.run(main())


def test_a_model_that_fails_to_load_is_reported_not_hidden_and_the_why_stays_in_the_log(caplog):
    """The probes are public: they say that loading failed, and only the log says where and why."""

    def broken_loader():
        raise ValueError("weights are corrupt")

    app = create_app(ServeConfig(checkpoint="/srv/secret-models/x", api_key=""), predictor_factory=broken_loader)

    async def main():
        async with served(app, ready=False) as client:
            health = await _poll(client, "/health", 503)
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            assert health.json()["error"] == "the model failed to load (the server log says why)"
            ready = await client.get("/ready")
            assert ready.status_code == 503 and "failed to load" in ready.json()["detail"]
            predict = await client.post("/predict", json={"text": "Oil prices jump"})
            return health.text + ready.text + predict.text

    shown = asyncio.run(main())
    assert "weights are corrupt" not in shown and "secret-models" not in shown and "ValueError" not in shown
    assert "could not load the model from /srv/secret-models/x: ValueError: weights are corrupt" in caplog.text


def test_the_public_health_probe_tells_no_version_or_runtime_which_info_tells_behind_the_key(fake_predictor):
    """/health answers anyone: whether the process is up and the model loaded (DESIGN.md's shape), nothing to match
    against known flaws. The version, the runtime and the uptime are on /info, which needs the key."""
    app = create_app(ServeConfig(checkpoint="unused", api_key="secret"), predictor_factory=fake_predictor)
    key = {"Authorization": "Bearer secret"}

    async def main():
        async with served(app, ready=False) as client:
            await _poll(client, "/ready", 200)
            health = await client.get("/health")
            info_without_key = await client.get("/info")
            info = await client.get("/info", headers=key)
            return health, info_without_key, info

    health, info_without_key, info = asyncio.run(main())
    assert health.status_code == 200 and health.json() == {"status": "healthy", "model_loaded": True}
    assert info_without_key.status_code == 401
    assert info.status_code == 200
    assert info.json()["runtime"] == "fake" and info.json()["version"] and info.json()["uptime_s"] >= 0


# ---------------------------------------------------------------------- clients that go away
@pytest.fixture
def gated_predictor(fake_predictor):
    class GatedPredictor(fake_predictor):
        """The forward pass blocks until the gate opens."""

        def __init__(self):
            super().__init__()
            self.gate = threading.Event()
            self.running = threading.Event()

        def predict_encoded(self, batch):
            self.running.set()
            assert self.gate.wait(10), "test gate never opened"
            return super().predict_encoded(batch)

    return GatedPredictor()


def test_a_client_that_hangs_up_while_queued_is_never_computed(asgi_post, gated_predictor):
    async def predict(app, text: str, hang_up: asyncio.Event | None = None) -> int:
        body = json.dumps({"text": text}).encode()
        status, _, _ = await asgi_post(app, [(b"content-length", str(len(body)).encode())], [body], hang_up)
        return status

    predictor = gated_predictor
    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=lambda: predictor)

    async def main():
        async with served(app) as client:
            busy = asyncio.ensure_future(predict(app, "keeps the model busy"))
            await await_until(predictor.running.is_set, 10, "the first forward pass")
            hang_up = asyncio.Event()
            gone = asyncio.ensure_future(predict(app, "nobody waits for this", hang_up))
            kept = asyncio.ensure_future(predict(app, "still wanted"))
            state = app.state.serve
            await await_until(
                lambda: state.batcher.queue_depth >= 2 and not state.batcher._tokenizing, 10, "two queued"
            )
            hang_up.set()  # the client disconnects while its request waits in the queue
            # its place in the queue is freed at once
            await await_until(lambda: state.batcher.queue_depth <= 1, 10, "the hung-up request to leave the queue")
            predictor.gate.set()
            statuses = await asyncio.gather(busy, gone, kept)
            metrics = (await client.get("/metrics")).text
            return statuses, metrics

    statuses, metrics = asyncio.run(main())
    assert predictor.computed == ["keeps the model busy", "still wanted"]
    assert statuses == [200, 499, 200]
    assert "distrinews_requests_dropped_total 1.0" in metrics
    assert 'route="/predict",status="499"' in metrics


def test_create_app_leaves_the_callers_config_as_it_was(monkeypatch, fake_predictor):
    monkeypatch.setenv("DISTRINEWS_API_KEY", "from-the-environment")
    config = ServeConfig(checkpoint="unused")
    before = dataclasses.replace(config)
    app = create_app(config, predictor_factory=fake_predictor)
    assert config == before and config.api_key is None
    assert app.state.config.api_key == "from-the-environment"


def test_the_page_and_the_api_description_speak_the_checkpoints_own_labels(tmp_path):
    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    desks = ["business", "sport", "tech"]
    model = build_model("tiny-random", labels=desks, dropout=0.0, seed=0).eval()
    best = save_servable(
        tmp_path / "best", model, model.state_dict(), build_tokenizer("tiny-random"), ServableInfo(label_names=desks)
    )
    app = create_app(ServeConfig(checkpoint=str(best), api_key="", runtime="torch"))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            page = (await client.get("/")).text  # before the model loads: read from its config.json
            schema = (await client.get("/openapi.json")).json()
        return page, schema

    page, schema = asyncio.run(main())
    assert "Labels: business, sport or tech." in page and "World" not in page
    assert (
        "Labels: business, sport or tech." in schema["info"]["description"]
        and "AG News" not in schema["info"]["description"]
    )
    (example,) = schema["components"]["schemas"]["PredictResponse"]["examples"]
    assert example["label"] == "business" and list(example["probabilities"]) == desks


@pytest.mark.parametrize("public_metrics", [False, True])
def test_every_computed_answer_names_its_model_version_and_metrics_can_be_public(fake_predictor, public_metrics):
    class Versioned(fake_predictor):
        def describe(self):
            return {**super().describe(), "model_version": "3.1.4"}

    config = ServeConfig(checkpoint="unused", api_key="k", public_metrics=public_metrics)
    app = create_app(config, predictor_factory=Versioned)
    key = {"authorization": "Bearer k"}

    async def main():
        async with served(app, ready=False) as client:
            ready = await _poll(client, "/ready", 200)
            one = await client.post("/predict", json={"text": "Oil prices jump"}, headers=key)
            batch = await client.post("/predict/batch", json={"texts": ["a", "b"]}, headers=key)
            info = await client.get("/info", headers=key)
            metrics = await client.get("/metrics")
            return ready, one, batch, info, metrics

    ready, one, batch, info, metrics = asyncio.run(main())
    for response in (ready, one, batch, info):
        assert response.status_code == 200 and response.headers["x-model-version"] == "3.1.4"
    assert info.json()["model_version"] == "3.1.4"
    assert metrics.status_code == (200 if public_metrics else 401)


# ---------------------------------------------------------------------- the API key
@pytest.mark.parametrize("entry", ["distrinews serve", "python -m distrinews.serve"])
@pytest.mark.parametrize("value", ["", " \n"])
def test_an_empty_api_key_refuses_to_start_in_one_line(entry, value, tmp_path, monkeypatch, capsys):
    """Set but empty (an empty Kubernetes secret) would have served every route to anyone."""
    import distrinews.serve.__main__ as slim
    import distrinews.serve.server as server
    from distrinews.cli import main

    monkeypatch.setenv("DISTRINEWS_API_KEY", value)
    for module in (server, slim):
        monkeypatch.setattr(module, "run_server", lambda *a, **k: pytest.fail("the server started"))
    flags = ["--checkpoint", str(tmp_path), "--port", "0"]
    code = main(["serve", *flags]) if entry == "distrinews serve" else slim.main(flags)
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (
        "distrinews: error: DISTRINEWS_API_KEY is set but empty: set it "
        "to the key clients must send, or unset it to serve without one"
    )


def test_no_api_key_beyond_loopback_is_a_one_line_warning(monkeypatch, caplog, fake_predictor):
    import uvicorn

    from distrinews.serve.server import run_server

    monkeypatch.delenv("DISTRINEWS_API_KEY", raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)  # everything up to listening, then nothing
    for host in ("127.0.0.1", "::1", "0.0.0.0"):
        run_server(ServeConfig(host=host, port=7860), fake_predictor)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "distrinews.serve"]
    assert warnings == ["no API key: anyone who reaches 0.0.0.0:7860 can use every route (set DISTRINEWS_API_KEY)"]


def test_the_routes_served_are_remembered_per_path_and_method_and_nothing_else_is(fake_predictor):
    from distrinews.serve.middleware import RouteMethods

    app = create_app(ServeConfig(api_key=""), predictor_factory=fake_predictor)
    table = RouteMethods(app.router)

    def scope(method: str, path: str) -> dict:
        return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}

    for _ in range(2):  # the second time from what was remembered
        assert table.not_served(scope("POST", "/predict")) is None
        assert table.not_served(scope("GET", "/predict")) == ["POST"]  # still a 405 after a served POST
        assert table.not_served(scope("DELETE", "/health")) == ["GET"]
        assert table.not_served(scope("POST", "/no/such/path")) is None  # the router's 404
        assert table.not_served(scope("FOO", "/predict")) == ["POST"]
    assert table._served == {("/predict", "POST")}  # clients' other paths and methods are not kept


def test_the_slim_server_refuses_a_checkpoint_removed_before_it_loads_in_one_line(tmp_path, monkeypatch, capsys):
    """The folder is there when the options are checked and gone when the torch runtime checks it can load."""
    import shutil

    import distrinews.serve.__main__ as slim
    from distrinews.model import resolve_model_path
    from distrinews.serve.options import validate

    checkpoint = tmp_path / "model"
    shutil.copytree(resolve_model_path("tiny-random"), checkpoint)

    def validate_then_remove(args):
        validate(args)
        shutil.rmtree(checkpoint)

    monkeypatch.setattr(slim, "validate", validate_then_remove)
    monkeypatch.setattr(slim, "run_server", lambda *a, **k: pytest.fail("the server started"))
    code = slim.main(["--checkpoint", str(checkpoint), "--runtime", "torch", "--port", "0"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and lines == [f"distrinews: error: checkpoint {checkpoint} does not exist"], lines

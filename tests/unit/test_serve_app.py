"""The app's model lifecycle, in process with a controllable loader: 503 while loading, 200 after, 503 if loading fails."""

from __future__ import annotations

import asyncio
import threading

import httpx

from distrinews.serve.app import ServeConfig, create_app


class FakePredictor:
    runtime = "fake"

    def warmup(self) -> None:
        pass

    def predict(self, texts):
        return [
            {
                "label": "World",
                "label_id": 0,
                "confidence": 1.0,
                "probabilities": {"World": 1.0, "Sports": 0.0, "Business": 0.0, "Sci/Tech": 0.0},
            }
            for _ in texts
        ]

    def describe(self):
        return {
            "model_name": "fake",
            "runtime": self.runtime,
            "labels": ["World", "Sports", "Business", "Sci/Tech"],
            "max_length": 8,
            "metrics": {},
        }


async def _poll(client: httpx.AsyncClient, path: str, status: int, timeout: float = 10.0) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        response = await client.get(path)
        if response.status_code == status or loop.time() > deadline:
            return response
        await asyncio.sleep(0.01)


def test_ready_and_predict_say_503_until_the_model_has_loaded():
    gate = threading.Event()

    def slow_loader():
        assert gate.wait(10)
        return FakePredictor()

    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=slow_loader)

    async def main():
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client,
        ):
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


def test_a_model_that_fails_to_load_is_reported_not_hidden():
    def broken_loader():
        raise ValueError("weights are corrupt")

    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=broken_loader)

    async def main():
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client,
        ):
            health = await _poll(client, "/health", 503)
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            assert "weights are corrupt" in health.json()["error"]
            ready = await client.get("/ready")
            assert ready.status_code == 503 and "failed to load" in ready.json()["detail"]

    asyncio.run(main())

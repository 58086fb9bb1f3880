"""The batching window waits only for work known to be coming: requests being tokenized, or received by the HTTP
layer and not yet queued (``serve.arrivals``). Each test gives the window an hour: a batcher that waited for
company which is not coming would still be waiting when the test gives up."""

from __future__ import annotations

import asyncio
import json

from test_serve_batcher import GatedModel

from conftest import await_until
from distrinews.serve.arrivals import Arrivals, ArrivalsMiddleware
from distrinews.serve.batcher import MicroBatcher

HOUR_MS = 3_600_000


async def _until(predicate) -> None:
    await await_until(predicate, 30, "the condition")


def _arriving(arrivals: Arrivals, path: str = "/predict"):
    """An HTTP request on its way through the middleware: its route waits for ``go``, then runs ``then``."""
    go = asyncio.Event()
    outcome: dict[str, object] = {}

    async def route(scope, receive, send) -> None:
        await go.wait()
        outcome["result"] = await outcome["then"]()  # type: ignore[operator]

    middleware = ArrivalsMiddleware(route, arrivals, ("/predict",))
    task = asyncio.ensure_future(middleware({"type": "http", "method": "POST", "path": path}, None, None))
    return go, outcome, task


def test_a_batch_waits_for_a_request_on_its_way_and_starts_when_it_lands():
    async def main():
        model = GatedModel()
        arrivals = Arrivals()
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=HOUR_MS, arrivals=arrivals)
        await batcher.start()
        go, outcome, task = _arriving(arrivals)
        outcome["then"] = lambda: batcher.submit(["second"])
        await _until(lambda: arrivals.pending == 1)
        first = asyncio.ensure_future(batcher.submit(["first"]))
        await asyncio.sleep(0.05)
        assert not model.batches, "the batch started although a request was known to be coming"
        go.set()
        await asyncio.wait_for(asyncio.gather(first, task), 60)
        await batcher.close()
        return model.batches, first.result(), outcome["result"], arrivals.pending

    batches, first, second, pending = asyncio.run(main())
    assert batches == [["first", "second"]]
    assert (first, second, pending) == (["FIRST"], ["SECOND"], 0)


def test_the_window_closes_at_once_when_the_request_on_its_way_is_turned_away():
    async def main():
        model = GatedModel()
        arrivals = Arrivals()
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=HOUR_MS, arrivals=arrivals)
        await batcher.start()
        go, outcome, task = _arriving(arrivals)

        async def rejected() -> str:  # a 422: answered without reaching the queue
            return "422"

        outcome["then"] = rejected
        await _until(lambda: arrivals.pending == 1)
        first = asyncio.ensure_future(batcher.submit(["first"]))
        await asyncio.sleep(0.05)
        go.set()
        answer = await asyncio.wait_for(first, 60)
        await task
        await batcher.close()
        return answer, arrivals.pending

    assert asyncio.run(main()) == (["FIRST"], 0)


def test_after_a_shared_batch_a_request_with_nothing_coming_starts_at_once():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=HOUR_MS)
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["x"]))
        await _until(model.started.is_set)
        pair = [asyncio.ensure_future(batcher.submit([t])) for t in ("a", "b")]
        await _until(lambda: batcher.queue_depth == 2)
        model.gate.set()
        # The pair arrived while the model was busy, and then shared a batch: once signs of concurrency, now nothing
        await asyncio.wait_for(asyncio.gather(blocker, *pair), 60)
        lone = await asyncio.wait_for(batcher.submit(["lone"]), 60)
        await batcher.close()
        return model.batches, lone

    batches, lone = asyncio.run(main())
    assert batches == [["x"], ["a", "b"], ["lone"]] and lone == ["LONE"]


def test_only_post_requests_to_the_given_paths_count_and_each_counts_once():
    async def main():
        arrivals = Arrivals()
        seen: list[int] = []

        async def app(scope, receive, send) -> None:
            seen.append(arrivals.pending)
            arrivals.landed()
            arrivals.landed()  # a second landing of the same request changes nothing
            seen.append(arrivals.pending)

        middleware = ArrivalsMiddleware(app, arrivals, ("/predict",))
        for method, path in (("POST", "/predict"), ("GET", "/predict"), ("POST", "/health")):
            await middleware({"type": "http", "method": method, "path": path}, None, None)
        arrivals.landed()  # outside any request: nothing
        return seen, arrivals.pending

    assert asyncio.run(main()) == ([1, 0, 0, 0, 0, 0], 0)


def test_in_the_app_a_request_whose_body_is_still_coming_is_waited_for(fake_predictor, asgi_post):
    """Through every middleware of the app: request A's body arrives in two parts; B, complete, is queued first
    and waits for A (the window is an hour, so only A's landing can close it); then both share one pass."""
    from conftest import served
    from distrinews.serve.app import ServeConfig, create_app

    class Recording(fake_predictor):
        def __init__(self):
            super().__init__()
            self.batches: list[int] = []

        def predict_encoded(self, batch):
            self.batches.append(len(batch))
            return super().predict_encoded(batch)

    predictor = Recording()
    config = ServeConfig(checkpoint="unused", api_key="", max_wait_ms=HOUR_MS, concurrent_passes=1)
    app = create_app(config, predictor_factory=lambda: predictor)
    body = json.dumps({"text": "the slow client's text"}).encode()

    async def slow_post(rest: asyncio.Event) -> int:
        headers = [(b"content-length", str(len(body)).encode())]
        status, _, _ = await asgi_post(app, headers, [body[:5], body[5:]], hold_last=rest)
        return status

    async def main():
        async with served(app) as client:
            state = app.state.serve
            rest = asyncio.Event()
            slow = asyncio.ensure_future(slow_post(rest))
            await _until(lambda: state.arrivals.pending == 1)
            quick = asyncio.ensure_future(client.post("/predict", json={"text": "the quick client's text"}))
            await _until(lambda: state.batcher.queue_depth == 1 and not state.batcher._tokenizing)
            await asyncio.sleep(0.05)
            assert predictor.batches == [], "the batch started while a request's body was still coming"
            rest.set()
            answers = await asyncio.wait_for(asyncio.gather(slow, quick), 60)
            return answers[0], answers[1].status_code, predictor.batches, state.arrivals.pending

    assert asyncio.run(main()) == (200, 200, [2], 0)

"""The micro-batcher on its own: coalescing, the wait window, the size cap, back-pressure, draining."""

from __future__ import annotations

import asyncio
import threading

import pytest

from distrinews.serve.batcher import BatcherClosedError, MicroBatcher, QueueFullError


class GatedModel:
    """A fake predict(): records each batch; blocks while the gate is closed."""

    def __init__(self, open_gate: bool = True):
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.started = threading.Event()
        if open_gate:
            self.gate.set()

    def __call__(self, texts: list[str]) -> list[str]:
        self.batches.append(list(texts))
        self.started.set()
        assert self.gate.wait(10), "test gate never opened"
        return [t.upper() for t in texts]


async def _until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_results_come_back_to_the_right_caller_in_order():
    async def main():
        model = GatedModel()
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=20)
        await batcher.start()
        results = await asyncio.gather(batcher.submit(["a", "b"]), batcher.submit(["c"]), batcher.submit(["d", "e", "f"]))
        await batcher.close()
        return results

    assert asyncio.run(main()) == [["A", "B"], ["C"], ["D", "E", "F"]]


def test_requests_arriving_during_a_forward_pass_share_the_next_one():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=32, max_wait_ms=5)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(["first"]))
        await _until(model.started.is_set)
        rest = [asyncio.ensure_future(batcher.submit([f"t{i}"])) for i in range(5)]
        await _until(lambda: batcher.queue_depth == 5)
        model.gate.set()
        await asyncio.gather(first, *rest)
        await batcher.close()
        return model.batches

    batches = asyncio.run(main())
    assert batches == [["first"], ["t0", "t1", "t2", "t3", "t4"]]


def test_a_lone_request_does_not_wait_for_company():
    async def main():
        batcher = MicroBatcher(GatedModel(), max_batch_size=32, max_wait_ms=2000)
        await batcher.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await batcher.submit(["alone"])
        elapsed = loop.time() - t0
        await batcher.close()
        return elapsed

    assert asyncio.run(main()) < 1.0  # far below the 2 s window


def test_batches_never_exceed_max_batch_size_and_whole_requests_stay_together():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=4, max_wait_ms=50)
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["x"]))
        await _until(model.started.is_set)
        futures = [asyncio.ensure_future(batcher.submit([f"{i}a", f"{i}b", f"{i}c"])) for i in range(3)]
        futures.append(asyncio.ensure_future(batcher.submit(["big"] * 9)))  # bigger than a batch: alone
        await _until(lambda: batcher.queue_depth == 18)
        model.gate.set()
        results = await asyncio.gather(blocker, *futures)
        await batcher.close()
        return model.batches, results

    batches, results = asyncio.run(main())
    assert [len(b) for b in batches] == [1, 3, 3, 3, 9]
    assert results[1] == ["0A", "0B", "0C"] and results[-1] == ["BIG"] * 9


def test_a_full_queue_rejects_instead_of_growing():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=1, max_wait_ms=0, max_queue=2)
        await batcher.start()
        running = asyncio.ensure_future(batcher.submit(["running"]))
        await _until(model.started.is_set)
        queued = [asyncio.ensure_future(batcher.submit([f"q{i}"])) for i in range(2)]
        await _until(lambda: batcher.queue_depth == 2)
        with pytest.raises(QueueFullError, match="limit 2"):
            await batcher.submit(["one too many"])
        model.gate.set()
        done = await asyncio.gather(running, *queued)
        # Once the queue drained, new work is admitted again.
        again = await batcher.submit(["again"])
        await batcher.close()
        return done, again

    done, again = asyncio.run(main())
    assert done == [["RUNNING"], ["Q0"], ["Q1"]] and again == ["AGAIN"]


def test_close_finishes_queued_work_then_refuses_new_work():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=2, max_wait_ms=1000)
        await batcher.start()
        futures = [asyncio.ensure_future(batcher.submit([f"t{i}"])) for i in range(5)]
        await _until(model.started.is_set)
        closing = asyncio.ensure_future(batcher.close())
        await asyncio.sleep(0.01)
        with pytest.raises(BatcherClosedError):
            await batcher.submit(["late"])
        model.gate.set()
        await closing
        return [f.result() for f in futures]

    assert asyncio.run(main()) == [[f"T{i}"] for i in range(5)]


def test_a_failing_forward_pass_fails_its_requests_only():
    calls = []

    def flaky(texts):
        calls.append(texts)
        if "boom" in texts:
            raise ValueError("model exploded")
        return texts

    async def main():
        batcher = MicroBatcher(flaky, max_batch_size=1, max_wait_ms=0)
        await batcher.start()
        with pytest.raises(ValueError, match="exploded"):
            await batcher.submit(["boom"])
        ok = await batcher.submit(["fine"])
        await batcher.close()
        return ok

    assert asyncio.run(main()) == ["fine"]

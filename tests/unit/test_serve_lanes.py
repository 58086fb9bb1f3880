"""The micro-batcher's lanes: a lone request on every core, concurrent batches side by side on one core each, and
the faults of a pass running beside another (a bad text, a stuck pass, a bug in the loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from distrinews.serve.batch_runner import ForwardError, ForwardStalledError
from distrinews.serve.batcher import BatcherClosedError, MicroBatcher


class Recorder:
    """Two fake forwards, ``wide`` (every core) and ``side`` (one core): each call recorded with its start and end,
    held while the gate of its first text (if any) is closed."""

    def __init__(self):
        self.calls: list[tuple[str, list[str], float, float]] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def gate(self, text: str) -> threading.Event:
        self.started[text] = threading.Event()
        self.gates[text] = threading.Event()
        return self.gates[text]

    def forward(self, kind: str):
        def run(texts: list[str]) -> list[str]:
            start = time.perf_counter()
            if texts[0] in self.gates:
                self.started[texts[0]].set()
                assert self.gates[texts[0]].wait(10), "test gate never opened"
            if any("bad" in t for t in texts):
                raise ValueError("this text breaks the model")
            time.sleep(0.002)
            with self.lock:
                self.calls.append((kind, list(texts), start, time.perf_counter()))
            return [t.upper() for t in texts]

        return run

    def batcher(self, **kwargs) -> MicroBatcher:
        kwargs.setdefault("max_wait_ms", 0)
        return MicroBatcher(self.forward("wide"), side_forward=self.forward("side"), lanes=2, **kwargs)


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        assert time.perf_counter() < deadline, "condition never came true"
        await asyncio.sleep(0.005)


def test_a_lone_client_gets_every_core_and_a_crowd_runs_side_by_side_never_beside_a_wide_pass():
    model = Recorder()

    async def main():
        batcher = model.batcher(max_wait_ms=5)
        await batcher.start()
        lone = [await batcher.submit([f"lone {k}"]) for k in range(3)]

        async def client(i: int) -> list[list[str]]:
            return [await batcher.submit([f"c{i} r{k}"]) for k in range(6)]

        crowd = await asyncio.gather(*(client(i) for i in range(12)))
        await batcher.close()
        return lone, crowd

    lone, crowd = asyncio.run(main())
    assert lone == [[f"LONE {k}"] for k in range(3)]
    assert crowd == [[[f"C{i} R{k}"] for k in range(6)] for i in range(12)]
    assert [kind for kind, *_ in model.calls[:3]] == ["wide"] * 3
    kinds = [kind for kind, *_ in model.calls[3:]]
    assert kinds.count("side") > kinds.count("wide"), kinds
    # At most two passes at once (two that both overlap a third may follow each other), and never one beside a pass
    # on every core.
    for kind, _, start, end in model.calls:
        beside = [other for other in model.calls if other[2] < end and start < other[3]]
        assert max(sum(1 for o in beside if o[2] <= at < o[3]) for at in (c[2] for c in beside)) <= 2
        if kind == "wide":
            assert len(beside) == 1, "a pass ran beside a wide one"
    assert any(len([o for o in model.calls if o[2] < c[3] and c[2] < o[3]]) == 2 for c in model.calls)


def test_with_both_lanes_free_what_is_queued_is_shared_between_them():
    model = Recorder()
    gate = model.gate("first")

    async def main():
        batcher = model.batcher()
        await batcher.start()
        first = batcher.enqueue(["first"])
        await _until(model.started["first"].is_set)
        queued = [batcher.enqueue([f"q{i}"]) for i in range(8)]  # all arrive while the model is busy
        gate.set()
        results = await asyncio.gather(first, *queued)
        await batcher.close()
        return results

    assert asyncio.run(main()) == [["FIRST"]] + [[f"Q{i}"] for i in range(8)]
    assert [(kind, len(texts)) for kind, texts, *_ in model.calls] == [("wide", 1), ("side", 4), ("side", 4)]


def test_a_text_that_breaks_a_pass_on_a_lane_fails_its_own_request_only():
    model = Recorder()
    gate = model.gate("first")

    async def main():
        batcher = model.batcher()
        await batcher.start()
        first = batcher.enqueue(["first"])
        await _until(model.started["first"].is_set)
        queued = [batcher.enqueue([text]) for text in ("a", "bad one", "b", "c")]
        gate.set()
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        await batcher.close()
        return results

    first, a, bad, b, c = asyncio.run(main())
    assert (first, a, b, c) == (["FIRST"], ["A"], ["B"], ["C"])
    assert isinstance(bad, ForwardError)
    assert {kind for kind, *_ in model.calls[1:]} == {"side"}  # the retry stays on the lane that failed


def test_the_batcher_refuses_work_until_every_stuck_lane_has_returned():
    model = Recorder()
    gates = {name: model.gate(name) for name in ("first", "x", "y")}

    async def main():
        batcher = model.batcher(forward_timeout=0.3)
        await batcher.start()
        first = batcher.enqueue(["first"])
        await _until(model.started["first"].is_set)
        x, y = batcher.enqueue(["x"]), batcher.enqueue(["y"])
        gates["first"].set()
        assert await first == ["FIRST"]
        await _until(lambda: model.started["x"].is_set() and model.started["y"].is_set())  # side by side
        for stuck in (x, y):
            with pytest.raises(ForwardStalledError):
                await stuck
        with pytest.raises(ForwardStalledError, match="the model is stuck"):
            batcher.enqueue(["refused"])
        gates["x"].set()
        await _until(lambda: any(texts == ["x"] for _, texts, *_ in model.calls))
        await asyncio.sleep(0.05)
        assert batcher.stalled is not None, "one lane is still stuck"
        gates["y"].set()
        await _until(lambda: batcher.stalled is None)
        after = await batcher.submit(["after"])
        await batcher.close()
        return after

    assert asyncio.run(main()) == ["AFTER"]


def test_a_loop_bug_in_one_pass_fails_every_running_batch_and_calls_on_fatal_once(monkeypatch):
    model = Recorder()
    gates = {name: model.gate(name) for name in ("first", "held")}
    fatal: list[str] = []

    async def main():
        batcher = model.batcher(on_fatal=fatal.append)
        compute = batcher._runner.run

        async def broken(batch, queue_s, forward, number):
            if batch[0].texts == ["breaks"]:
                raise KeyError("a bug")
            return await compute(batch, queue_s, forward, number)

        monkeypatch.setattr(batcher._runner, "run", broken)
        await batcher.start()
        first = batcher.enqueue(["first"])
        await _until(model.started["first"].is_set)
        held, breaks = batcher.enqueue(["held"]), batcher.enqueue(["breaks"])  # one lane each
        gates["first"].set()
        await first
        results = await asyncio.gather(breaks, held, return_exceptions=True)
        gates["held"].set()
        await batcher.close()
        return results

    breaks, held = asyncio.run(main())
    assert isinstance(breaks, BatcherClosedError) and isinstance(held, BatcherClosedError)
    assert fatal == ["the batching loop died (KeyError)"]


def test_close_waits_for_every_lane_to_finish():
    model = Recorder()
    gate = model.gate("first")

    async def main():
        batcher = model.batcher()
        await batcher.start()
        first = batcher.enqueue(["first"])
        await _until(model.started["first"].is_set)
        queued = [batcher.enqueue([f"q{i}"]) for i in range(6)]
        closing = asyncio.ensure_future(batcher.close())
        await asyncio.sleep(0.05)
        gate.set()
        await closing
        return await asyncio.gather(first, *queued)

    assert asyncio.run(main()) == [["FIRST"]] + [[f"Q{i}"] for i in range(6)]
    assert sorted(kind for kind, *_ in model.calls) == ["side", "side", "wide"]

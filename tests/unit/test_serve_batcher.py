"""The micro-batcher on its own: coalescing, the wait window, the size and token caps, back-pressure, draining,
the tokenizer thread, and requests withdrawn by clients that went away."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrinews.serve.batch_runner import ForwardError, ForwardStalledError
from distrinews.serve.batcher import (
    FORWARD_THREAD,
    TOKENIZER_THREAD,
    BatcherClosedError,
    MicroBatcher,
    QueueFullError,
)


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


async def _until(predicate, timeout: float = 30.0) -> None:
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
        results = await asyncio.gather(
            batcher.submit(["a", "b"]), batcher.submit(["c"]), batcher.submit(["d", "e", "f"])
        )
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
        # an hour's window: a batcher that waited for company would still wait when the test gives up
        batcher = MicroBatcher(GatedModel(), max_batch_size=32, max_wait_ms=3_600_000)
        await batcher.start()
        answer = await asyncio.wait_for(batcher.submit(["alone"]), 60)
        await batcher.close()
        return answer

    assert asyncio.run(main()) == ["ALONE"]


def test_batches_never_exceed_max_batch_size_and_whole_requests_stay_together():
    async def main():
        model = GatedModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=4, max_wait_ms=50)
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["x"]))
        await _until(model.started.is_set)
        futures = [asyncio.ensure_future(batcher.submit([f"{i}a", f"{i}b", f"{i}c"])) for i in range(3)]
        # Bigger than a batch: alone, as forward passes of at most 4 texts, results still in order.
        futures.append(asyncio.ensure_future(batcher.submit([f"big{i}" for i in range(9)])))
        await _until(lambda: batcher.queue_depth == 18)
        model.gate.set()
        results = await asyncio.gather(blocker, *futures)
        await batcher.close()
        return model.batches, results

    batches, results = asyncio.run(main())
    assert [len(b) for b in batches] == [1, 3, 3, 3, 4, 4, 1]
    assert results[1] == ["0A", "0B", "0C"] and results[-1] == [f"BIG{i}" for i in range(9)]


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
        await _until(lambda: batcher._closing)
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
        with pytest.raises(ForwardError) as info:
            await batcher.submit(["boom"])
        assert isinstance(info.value.__cause__, ValueError) and "exploded" not in str(info.value)
        ok = await batcher.submit(["fine"])
        await batcher.close()
        return ok

    assert asyncio.run(main()) == ["fine"]


def test_a_text_that_breaks_a_shared_pass_fails_its_own_request_only():
    """The pass of three requests raises; each is retried alone, and only the one with the bad text gets the error."""
    model = GatedModel(open_gate=False)

    def flaky(texts):
        if "boom" in texts:
            model.batches.append(list(texts))
            raise ValueError("model exploded")
        return model(texts)

    async def main():
        batcher = MicroBatcher(flaky, max_batch_size=8, max_wait_ms=50)
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["blocker"]))
        await _until(model.started.is_set)
        futures = [asyncio.ensure_future(batcher.submit(texts)) for texts in (["a", "b"], ["boom"], ["c"])]
        await _until(lambda: batcher.queue_depth == 4)
        model.gate.set()
        results = await asyncio.gather(blocker, *futures, return_exceptions=True)
        await batcher.close()
        return results

    blocker, first, bad, last = asyncio.run(main())
    assert (blocker, first, last) == (["BLOCKER"], ["A", "B"], ["C"])
    assert isinstance(bad, ForwardError) and isinstance(bad.__cause__, ValueError)
    assert model.batches[1] == ["a", "b", "boom", "c"], model.batches  # one shared pass first, then one per request
    assert model.batches[2:] == [["a", "b"], ["boom"], ["c"]], model.batches


def test_a_pass_past_its_deadline_fails_its_queue_with_503s_until_it_returns():
    model = GatedModel(open_gate=False)

    async def main():
        batcher = MicroBatcher(model, max_batch_size=1, max_wait_ms=0, forward_timeout=0.2)
        await batcher.start()
        stuck = asyncio.ensure_future(batcher.submit(["stuck"]))
        await _until(model.started.is_set)
        queued = asyncio.ensure_future(batcher.submit(["queued"]))
        for future in (stuck, queued):
            with pytest.raises(ForwardStalledError, match="the model is stuck"):
                await future
        assert "--forward-timeout is 0.2s" in batcher.stalled
        with pytest.raises(ForwardStalledError):
            batcher.enqueue(["new"])
        model.gate.set()  # the pass returns: the model serves again
        await _until(lambda: batcher.stalled is None)
        ok = await batcher.submit(["after"])
        await batcher.close()
        return ok

    assert asyncio.run(main()) == ["AFTER"]


def test_a_batching_loop_that_dies_fails_its_queue_and_calls_on_fatal(monkeypatch):
    fatal: list[str] = []

    async def main():
        batcher = MicroBatcher(lambda texts: texts, max_batch_size=1, max_wait_ms=0, on_fatal=fatal.append)
        monkeypatch.setattr(batcher, "_take", lambda cap=None: 1 / 0)
        await batcher.start()
        with pytest.raises(BatcherClosedError, match="ZeroDivisionError"):
            await batcher.submit(["x"])
        with pytest.raises(BatcherClosedError):
            batcher.enqueue(["y"])
        await batcher.close()

    asyncio.run(main())
    assert fatal == ["the batching loop died (ZeroDivisionError)"]


def test_a_batching_loop_that_dies_mid_batch_fails_the_batch_it_was_running(monkeypatch):
    fatal: list[str] = []

    async def main():
        batcher = MicroBatcher(lambda texts: texts, max_batch_size=1, max_wait_ms=0, on_fatal=fatal.append)

        async def broken_compute(batch, queue_s, forward, number):
            raise KeyError("a bug")

        monkeypatch.setattr(batcher._runner, "run", broken_compute)
        await batcher.start()
        with pytest.raises(BatcherClosedError, match="KeyError"):
            await asyncio.wait_for(batcher.submit(["x"]), 10)
        await batcher.close()

    asyncio.run(main())
    assert fatal == ["the batching loop died (KeyError)"]


def test_an_on_batch_that_raises_does_not_stop_the_batcher():
    def broken(stats):
        raise RuntimeError("metrics broke")

    async def main():
        batcher = MicroBatcher(lambda texts: texts, max_batch_size=1, max_wait_ms=0, on_batch=broken)
        await batcher.start()
        results = [await batcher.submit([t]) for t in ("a", "b")]
        await batcher.close()
        return results

    assert asyncio.run(main()) == [["a"], ["b"]]


# ---------------------------------------------------------------------- token budget, tokenizer thread, gone clients
class RecordingModel(GatedModel):
    """GatedModel that also records the thread each forward ran on and what it was given."""

    def __init__(self, open_gate: bool = True):
        super().__init__(open_gate)
        self.threads: list[str] = []

    def __call__(self, items):
        self.threads.append(threading.current_thread().name)
        self.batches.append(list(items))
        self.started.set()
        assert self.gate.wait(10), "test gate never opened"
        return [" ".join(item).upper() if isinstance(item, list) else item.upper() for item in items]


def words(texts):
    """A stand-in tokenizer: one token per word (len(item) = tokens)."""
    return [t.split() for t in texts]


def _run_queued(sizes: list[int], max_batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Queue one request per size (that many tokens) behind a blocked forward pass; the batches, as request indices."""

    async def main():
        model = RecordingModel(open_gate=False)
        batcher = MicroBatcher(
            model, max_batch_size=max_batch_size, max_wait_ms=50, encode=words, max_batch_tokens=max_batch_tokens
        )
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["blocker"]))
        await _until(model.started.is_set)
        futures = [asyncio.ensure_future(batcher.submit([" ".join([f"r{i}"] * k)])) for i, k in enumerate(sizes)]
        await _until(lambda: batcher.queue_depth == len(sizes) and not batcher._tokenizing)
        model.gate.set()
        await asyncio.gather(blocker, *futures)
        await batcher.close()
        return [[int(item[0][1:]) for item in batch] for batch in model.batches[1:]]

    return asyncio.run(main())


def test_batches_stay_within_max_batch_tokens_and_group_similar_lengths():
    sizes = [2, 2, 3, 4, 1, 1]
    batches = _run_queued(sizes, max_batch_size=32, max_batch_tokens=12)
    # FIFO cut by the budget would be [2, 2, 3] (9 padded tokens) + [4, 1, 1] (12): 21 tokens.
    # Grouped around the oldest request: [2, 2, 1, 1] (8) + [3, 4] (8): 16 tokens.
    assert [[sizes[i] for i in batch] for batch in batches] == [[2, 2, 1, 1], [3, 4]]
    assert all(max(sizes[i] for i in b) * len(b) <= 12 for b in batches)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=24),
    max_batch_size=st.integers(1, 8),
    max_batch_tokens=st.integers(8, 96),
)
def test_the_oldest_waiting_request_is_always_in_the_next_batch(sizes, max_batch_size, max_batch_tokens):
    batches = _run_queued(sizes, max_batch_size, max_batch_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(sizes)))
    done: set[int] = set()
    for batch in batches:
        assert min(set(range(len(sizes))) - done) in batch, "the oldest waiting request must go first"
        padded = max(sizes[i] for i in batch) * len(batch)
        assert len(batch) <= max_batch_size and (padded <= max_batch_tokens or len(batch) == 1)
        done |= set(batch)


def test_a_request_over_the_token_budget_runs_as_passes_within_it_and_answers_in_order():
    async def main():
        model = RecordingModel()
        batcher = MicroBatcher(model, max_batch_size=32, max_wait_ms=0, encode=words, max_batch_tokens=10)
        await batcher.start()
        texts = [" ".join([f"t{i}"] * k) for i, k in enumerate([5, 1, 12, 2, 5, 3])]  # 12 tokens alone exceed 10
        result = await batcher.submit(texts)
        await batcher.close()
        return texts, model.batches, result

    texts, batches, result = asyncio.run(main())
    assert result == [t.upper() for t in texts]
    assert sorted(len(item) for batch in batches for item in batch) == [1, 2, 3, 5, 5, 12]
    for batch in batches:
        padded = max(len(item) for item in batch) * len(batch)
        assert padded <= 10 or len(batch) == 1, [len(item) for item in batch]


def test_tokenization_runs_on_its_own_thread_and_the_forward_pass_gets_tokens():
    encode_threads: list[str] = []

    def encode(texts):
        encode_threads.append(threading.current_thread().name)
        return words(texts)

    async def main():
        model = RecordingModel()
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=5, encode=encode)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit([f"text number {i}"]) for i in range(10)))
        await batcher.close()
        return model, results

    model, results = asyncio.run(main())
    assert results == [[f"TEXT NUMBER {i}"] for i in range(10)]
    assert encode_threads and all(name.startswith(TOKENIZER_THREAD) for name in encode_threads)
    assert model.threads and all(name.startswith(FORWARD_THREAD) for name in model.threads)
    assert all(isinstance(item, list) for batch in model.batches for item in batch), (
        "forward must get encoded items, not texts"
    )


def test_short_requests_are_tokenized_on_the_loop_as_they_arrive_and_long_ones_on_the_tokenizer_thread():
    encode_threads: dict[str, str] = {}

    def encode(texts):
        if "bad" in texts:
            raise ValueError("cannot tokenize")
        encode_threads[texts[0]] = threading.current_thread().name
        return words(texts)

    async def main():
        model = RecordingModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=5, encode=encode, encode_inline_chars=10)
        await batcher.start()
        first = batcher.enqueue(["short"])
        assert encode_threads == {"short": threading.current_thread().name}, "tokenized before enqueue returned"
        await _until(model.started.is_set)
        bad = batcher.enqueue(["bad"])
        assert bad.done() and isinstance(bad.exception(), ValueError)  # its own request fails, and at once
        short, long = batcher.enqueue(["tiny"]), batcher.enqueue(["a longer text"])  # 13 characters: over 10
        await _until(lambda: not batcher._tokenizing)
        model.gate.set()
        results = await asyncio.gather(first, short, long)
        depth = batcher.queue_depth
        await batcher.close()
        return results, depth

    results, depth = asyncio.run(main())
    assert results == [["SHORT"], ["TINY"], ["A LONGER TEXT"]] and depth == 0
    loop_thread = threading.current_thread().name  # asyncio.run ran the loop on this thread
    assert encode_threads["short"] == encode_threads["tiny"] == loop_thread
    assert encode_threads["a longer text"].startswith(TOKENIZER_THREAD)


def test_the_next_batch_is_tokenized_while_the_model_runs():
    encoded: list[str] = []

    def encode(texts):
        encoded.extend(texts)
        return words(texts)

    async def main():
        model = RecordingModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=5, encode=encode)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(["running now"]))
        await _until(model.started.is_set)
        rest = [asyncio.ensure_future(batcher.submit([f"next {i}"])) for i in range(3)]
        # The model is still blocked in the first pass, and the next batch's texts are already tokens.
        await _until(lambda: len(encoded) == 4)
        assert not model.gate.is_set() and len(model.batches) == 1
        model.gate.set()
        await asyncio.gather(first, *rest)
        await batcher.close()
        return model.batches

    assert [[" ".join(i) for i in b] for b in asyncio.run(main())] == [["running now"], ["next 0", "next 1", "next 2"]]


def test_a_withdrawn_request_is_never_computed():
    dropped: list[int] = []

    async def main():
        model = RecordingModel(open_gate=False)
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=5, encode=words, on_dropped=dropped.append)
        await batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["busy"]))
        await _until(model.started.is_set)
        kept = batcher.enqueue(["kept one"])
        gone = batcher.enqueue(["client went away"])
        also_kept = batcher.enqueue(["kept two"])
        await _until(lambda: not batcher._tokenizing)
        gone.cancel()  # what the app does when the HTTP client disconnects
        model.gate.set()
        results = await asyncio.gather(blocker, kept, also_kept)
        await batcher.close()
        return model.batches, results, batcher.queue_depth

    batches, results, depth = asyncio.run(main())
    seen = [" ".join(item) for batch in batches for item in batch]
    assert "client went away" not in seen and seen == ["busy", "kept one", "kept two"]
    assert results == [["BUSY"], ["KEPT ONE"], ["KEPT TWO"]]
    assert sum(dropped) == 1 and depth == 0


def test_a_request_withdrawn_while_it_is_tokenized_is_never_computed():
    dropped: list[int] = []
    tokenizer_gate = threading.Event()

    def slow_encode(texts):
        assert tokenizer_gate.wait(10)
        return words(texts)

    async def main():
        model = RecordingModel()
        batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=0, encode=slow_encode, on_dropped=dropped.append)
        await batcher.start()
        gone = batcher.enqueue(["never computed"])
        gone.cancel()
        tokenizer_gate.set()
        after = await batcher.submit(["computed"])
        await batcher.close()
        return model.batches, after, batcher.queue_depth

    batches, after, depth = asyncio.run(main())
    assert [[" ".join(i) for i in b] for b in batches] == [["computed"]] and after == ["COMPUTED"]
    assert sum(dropped) == 1 and depth == 0


def test_an_encoder_that_fails_fails_its_request_only():
    def encode(texts):
        if "bad" in texts:
            raise ValueError("cannot tokenize")
        return words(texts)

    async def main():
        batcher = MicroBatcher(RecordingModel(), max_batch_size=8, max_wait_ms=0, encode=encode)
        await batcher.start()
        with pytest.raises(ValueError, match="cannot tokenize"):
            await batcher.submit(["bad"])
        ok = await batcher.submit(["good text"])
        depth = batcher.queue_depth
        await batcher.close()
        return ok, depth

    assert asyncio.run(main()) == (["GOOD TEXT"], 0)


@pytest.mark.parametrize("bad", [{"max_batch_size": 0}, {"max_queue": 0}, {"max_batch_tokens": 0}, {"max_wait_ms": -1}])
def test_a_limit_below_its_least_is_refused(bad):
    limits = {"max_batch_size": 1, "max_wait_ms": 0, **bad}
    with pytest.raises(ValueError, match="must be >= 1, max_wait_ms >= 0"):
        MicroBatcher(lambda items: items, **limits)
    MicroBatcher(lambda items: items, max_batch_size=1, max_wait_ms=0, max_queue=1, max_batch_tokens=None)

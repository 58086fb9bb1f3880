"""What a serving process holds: the model loading on a worker thread, then its micro-batcher, through which every
request's texts are classified; a client that goes away has its texts withdrawn, and a failure is an ``ApiError``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from ..distributed import machine
from ..errors import CheckpointError
from .arrivals import Arrivals
from .batch_runner import ForwardError, ForwardStalledError
from .batcher import BatcherClosedError, MicroBatcher, QueueFullError
from .metrics import ServeMetrics
from .options import ServeConfig
from .protocol import ServingPredictor
from .schemas import LOAD_FAILED, ApiError

log = logging.getLogger("distrinews.serve")

MODEL_VERSION_HEADER = "X-Model-Version"
# A request of at most this many characters is tokenized on the event loop as it arrives, not on the tokenizer
# thread: every AG News text fits (the longest test row has 880), a 1,000-character text tokenizes in about
# 0.25 ms on a busy 2-core EPYC (0.07 ms for the median text), and each hop to a thread and back costs a wake-up.
ENCODE_INLINE_CHARS = 1_000


def _describe_load_error(exc: Exception, checkpoint: str | None) -> str:
    """One line for the log's record of a failed load (clients are told none of it): CheckpointError and
    FileNotFoundError as they are, anything else by its type and first line, or by its type alone where it repeats
    torch's advice to retry with ``weights_only=False``."""
    text = str(exc)
    if "weights_only" in text or "trust the source" in text:
        why = " (refused; the server log has the details)"
    elif isinstance(exc, (FileNotFoundError, CheckpointError)):
        return " ".join(text.split())
    else:
        why = f": {text.strip().splitlines()[0].strip()[:200]}" if text.strip() else ""
    return f"could not load the model from {checkpoint}: {type(exc).__name__}{why}"


def default_factory(config: ServeConfig) -> Callable[[], ServingPredictor]:
    def load() -> ServingPredictor:
        from ..predict.runtimes import make_predictor

        if not config.checkpoint:
            raise ValueError("no checkpoint: pass --checkpoint or set MODEL_CHECKPOINT")
        return make_predictor(
            config.checkpoint,
            runtime=config.runtime,
            max_batch_size=config.max_batch_size,
            onnx_model=config.onnx_model,
            # 0: the runtime's own default, unless a CPU quota allows fewer cores than that default would count
            threads=config.threads or machine.quota_limited_cores(),
            min_confidence=config.min_confidence,
            # Between passes the runtime's idle threads would spin on cores the event loop needs to answer, parse
            # the next request and let the clients on the machine send it, and the other lanes need to run theirs;
            # they stop spinning when a pass returns instead.
            spin=False,
        )

    return load


def concurrent_passes(config: ServeConfig, predictor: ServingPredictor) -> int:
    """How many forward passes may run side by side, one core each (``--concurrent-passes``, the batcher's lanes). A
    predictor without a single-threaded twin (PyTorch's threads are per process) runs one at a time."""
    wanted = config.concurrent_passes or (1 if config.threads else machine.usable_cores())
    if wanted > 1 and not hasattr(predictor, "single_threaded"):
        log.info("--concurrent-passes: the %s runtime runs one forward pass at a time", predictor.runtime)
        return 1
    return wanted


class ServingState:
    """The model behind the API: loaded in the background, then a micro-batcher in front of it."""

    def __init__(self, config: ServeConfig, load_predictor: Callable[[], ServingPredictor], metrics: ServeMetrics):
        self.config, self.load_predictor, self.metrics = config, load_predictor, metrics
        self.predictor: ServingPredictor | None = None
        self.batcher: MicroBatcher | None = None
        self.concurrent_passes = 1  # forward passes side by side under load, once loaded
        self.load_error: str | None = None
        self.fatal_error: str | None = None  # the batcher can answer nothing any more: the process is ending
        # Sent as X-Model-Version with every answer the model computed: behind a load balancer, during a
        # rollout, each answer names the model that made it.
        self.model_version: str | None = None
        self.started = time.time()
        # The requests the HTTP layer is receiving for the batcher (ArrivalsMiddleware counts them)
        self.arrivals = Arrivals()
        metrics.model_loaded.set_function(lambda: 1.0 if self.batcher is not None else 0.0)
        metrics.queue_depth.set_function(lambda: float(self.batcher.queue_depth) if self.batcher is not None else 0.0)

    async def load(self) -> None:
        config, t0 = self.config, time.perf_counter()
        try:
            predictor = await asyncio.to_thread(self.load_predictor)
            await asyncio.to_thread(predictor.warmup)
            lanes, side = concurrent_passes(config, predictor), None
            if lanes > 1:
                side = await asyncio.to_thread(predictor.single_threaded)  # type: ignore[attr-defined]
                await asyncio.to_thread(side.warmup)
            batcher = MicroBatcher(
                predictor.predict_encoded,
                config.max_batch_size,
                config.max_wait_ms,
                config.max_queue,
                on_batch=self.metrics.observe_batch,
                encode=predictor.encode,
                max_batch_tokens=config.max_batch_tokens,
                on_dropped=self.metrics.dropped.inc,
                forward_timeout=config.forward_timeout,
                on_fatal=self.end_process,
                encode_inline_chars=ENCODE_INLINE_CHARS,
                side_forward=side.predict_encoded if side is not None else None,
                lanes=lanes,
                arrivals=self.arrivals,
            )
            await batcher.start()
            self.model_version = str(predictor.describe().get("model_version") or "unversioned")
            self.predictor, self.batcher, self.concurrent_passes = predictor, batcher, lanes
            took = time.perf_counter() - t0
            log.info("model loaded from %s (runtime %s) in %.1fs; ready", config.checkpoint, predictor.runtime, took)
        except Exception as exc:  # the server stays up to report it: /health 503, /ready 503
            # What failed and where goes to the operator's log only: the probes are public.
            self.load_error = LOAD_FAILED
            log.error("%s", _describe_load_error(exc, config.checkpoint), exc_info=exc)

    def end_process(self, reason: str) -> None:
        """The batcher died: drain what can be answered (with 503s) and exit non-zero, so a supervisor restarts us."""
        self.fatal_error = reason
        signal.raise_signal(signal.SIGTERM)  # uvicorn's handler: stop accepting, answer what is in flight, exit

    def version_header(self) -> dict[str, str]:
        return {MODEL_VERSION_HEADER: self.model_version} if self.model_version else {}

    async def close(self) -> None:
        if self.batcher is not None:
            # uvicorn has already waited for in-flight requests; this finishes any queued work and stops the threads
            await self.batcher.close()

    def require_ready(self) -> MicroBatcher:
        if self.batcher is None:
            detail = self.load_error or "model is still loading; retry shortly (GET /ready turns 200 when it is ready)"
            raise ApiError(503, detail, {"Retry-After": "1"})
        if (stalled := self.batcher.stalled) is not None:
            raise ApiError(503, f"{stalled}; retry on another replica", {"Retry-After": "1"})
        return self.batcher

    async def classify(
        self,
        texts: list[str],
        receive: Callable[[], Any] | None = None,
        timing: dict[str, float] | None = None,
        encode: Callable[[list[str]], Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The texts' results from the micro-batcher (``timing`` and ``encode``: ``MicroBatcher.enqueue``'s). With the
        request's ASGI ``receive``, a client that disconnects before its batch forms is taken out of the queue."""
        batcher, watcher = self.require_ready(), None
        try:
            future = batcher.enqueue(texts, timing, encode)
            if receive is not None:
                watcher = asyncio.get_running_loop().create_task(_cancel_when_disconnected(receive, future))
            results = await future
            self.metrics.count_answers(results)
            return results
        except QueueFullError as exc:
            raise ApiError(429, str(exc), {"Retry-After": "1"}) from None
        except (BatcherClosedError, ForwardStalledError) as exc:
            raise ApiError(503, f"{exc}; retry on another replica", {"Retry-After": "1"}) from None
        except ForwardError:  # the batcher logged the cause; it names internals, so the client is not told it
            raise ApiError(500, "the model failed on this request's texts (the server log has the details)") from None
        except asyncio.CancelledError:
            if watcher is not None and watcher.done() and not watcher.cancelled() and watcher.result():
                raise ApiError(499, "client closed the request before it was computed") from None
            raise
        finally:
            if watcher is not None:
                watcher.cancel()


async def _cancel_when_disconnected(receive: Callable[[], Any], future: asyncio.Future[list[Any]]) -> bool:
    """Wait for the client to disconnect (the body is already read); then withdraw its request."""
    for _ in range(16):  # after the body a server sends nothing but the disconnect; never spin on a stray message
        message = await receive()
        if message["type"] == "http.disconnect":
            return future.cancel()
    return False

"""The HTTP API: a FastAPI app factory around the predictor and the micro-batcher.

``create_app(ServeConfig(...))`` builds an app whose lifespan handler loads the model on a
worker thread: the server answers ``/health`` (and ``/ready`` with 503) while the model
loads, then serves. Every error the app answers is JSON ``{"detail": "<what to fix>"}``
(``schemas.ApiError``); bad input is a 4xx, never a 500, and reading it is bounded
(``limits``). ``POST /predict`` (and ``POST /``, ``/invocations``) also speaks
text-embeddings-inference's and Hugging Face's shapes, with their answers and errors (``tei``).
Every route declares its status codes with an example body (``responses``); the prediction routes are registered
with their bodies, answers and limits for /docs by ``openapi``. Around the routes
sit the middlewares (``middleware``) and the app's own Prometheus registry (``metrics``).

Malformed HTTP itself (an unparsable request line or header, a ``Content-Length`` that is not
a number, two different ``Content-Length`` headers) is answered by the HTTP server (uvicorn's
h11 protocol) with a plain-text 400 before the app is called; the app cannot change that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import logging
import signal
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, tracing
from ..errors import CheckpointError
from ..predict.predictor import checkpoint_labels
from . import tei
from .batcher import BatcherClosedError, ForwardError, ForwardStalledError, MicroBatcher, QueueFullError
from .limits import clean_text, parse_body, read_object, validate_body
from .metrics import ServeMetrics
from .middleware import PUBLIC_PATHS, ApiKeyMiddleware, BodyBudget, BodyLimitMiddleware, MetricsMiddleware
from .openapi import label_examples, route_predict, route_predict_batch
from .options import ServeConfig, api_key_from_env
from .protocol import ServingPredictor
from .responses import declared
from .schemas import ApiError, BatchPredictRequest, PredictRequest, error_response

log = logging.getLogger("distrinews.serve")

MODEL_VERSION_HEADER = "X-Model-Version"
# A request of at most this many characters is tokenized on the event loop as it arrives, not on the tokenizer
# thread: every AG News text fits (the longest test row has 880), a 1,000-character text tokenizes in about
# 0.25 ms on a busy 2-core EPYC (0.07 ms for the median text), and each hop to a thread and back costs a wake-up.
ENCODE_INLINE_CHARS = 1_000


def _describe_load_error(exc: Exception, checkpoint: str | None) -> str:
    """One line for the log's record of a failed load: what failed and where, never how to unpickle anyway.

    CheckpointError and FileNotFoundError already name the file and say why; anything else is
    summarised by its type and first line, or by its type alone when it repeats torch's advice
    to retry with ``weights_only=False``. Clients are told none of it (the probes are public).
    """
    text = str(exc)
    if "weights_only" in text or "trust the source" in text:
        return (
            f"could not load the model from {checkpoint}: "
            f"{type(exc).__name__} (refused; the server log has the details)"
        )
    if isinstance(exc, (FileNotFoundError, CheckpointError)):
        return " ".join(text.split())
    first = text.strip().splitlines()[0].strip()[:200] if text.strip() else ""
    return f"could not load the model from {checkpoint}: {type(exc).__name__}" + (f": {first}" if first else "")


def _default_factory(config: ServeConfig) -> Callable[[], ServingPredictor]:
    def load():
        from ..predict.runtimes import make_predictor

        if not config.checkpoint:
            raise ValueError("no checkpoint: pass --checkpoint or set MODEL_CHECKPOINT")
        return make_predictor(
            config.checkpoint,
            runtime=config.runtime,
            max_batch_size=config.max_batch_size,
            onnx_model=config.onnx_model,
            threads=config.threads or None,
            min_confidence=config.min_confidence,
            # Between passes the runtime's idle threads would spin on cores the event loop needs to answer, parse
            # the next request and let the clients on the machine send it; they sleep instead.
            spin=False,
        )

    return load


class ServingState:
    """The model behind the API: loaded in the background, then a micro-batcher in front of it."""

    def __init__(self, config: ServeConfig, load_predictor: Callable[[], ServingPredictor], metrics: ServeMetrics):
        self.config, self.load_predictor, self.metrics = config, load_predictor, metrics
        self.predictor: ServingPredictor | None = None
        self.batcher: MicroBatcher | None = None
        self.load_error: str | None = None
        self.fatal_error: str | None = None  # the batcher can answer nothing any more: the process is ending
        # Sent as X-Model-Version with every answer the model computed: behind a load balancer, during a
        # rollout, each answer names the model that made it.
        self.model_version: str | None = None
        self.started = time.time()
        metrics.model_loaded.set_function(lambda: 1.0 if self.batcher is not None else 0.0)
        metrics.queue_depth.set_function(lambda: float(self.batcher.queue_depth) if self.batcher is not None else 0.0)

    async def load(self) -> None:
        config = self.config
        try:
            t0 = time.perf_counter()
            predictor = await asyncio.to_thread(self.load_predictor)
            await asyncio.to_thread(predictor.warmup)
            batcher = MicroBatcher(
                predictor.predict_encoded,
                config.max_batch_size,
                config.max_wait_ms,
                config.max_queue,
                on_batch=self.metrics.observe_batch,
                encode=predictor.encode,
                max_batch_tokens=config.max_batch_tokens or None,
                on_dropped=self.metrics.dropped.inc,
                forward_timeout=config.forward_timeout,
                on_fatal=self.end_process,
                encode_inline_chars=ENCODE_INLINE_CHARS,
            )
            await batcher.start()
            self.model_version = str(predictor.describe().get("model_version") or "unversioned")
            self.predictor, self.batcher = predictor, batcher
            log.info(
                "model loaded from %s (runtime %s) in %.1fs; ready",
                config.checkpoint,
                predictor.runtime,
                time.perf_counter() - t0,
            )
        except Exception as exc:  # the server stays up to report it: /health 503, /ready 503
            # What failed and where goes to the operator's log only: the probes are public.
            self.load_error = "the model failed to load (the server log says why)"
            log.error("%s", _describe_load_error(exc, config.checkpoint), exc_info=exc)

    def end_process(self, reason: str) -> None:
        """The batcher died: drain what can be answered (with 503s) and exit non-zero, so a supervisor restarts us."""
        self.fatal_error = reason
        signal.raise_signal(signal.SIGTERM)  # uvicorn's handler: stop accepting, answer what is in flight, exit

    def version_header(self) -> dict[str, str]:
        return {MODEL_VERSION_HEADER: self.model_version} if self.model_version else {}

    async def close(self) -> None:
        if self.batcher is not None:
            # uvicorn has already waited for in-flight requests; this finishes any queued work
            # and stops the worker thread.
            await self.batcher.close()

    def require_ready(self) -> MicroBatcher:
        if self.batcher is None:
            detail = self.load_error or "model is still loading; retry shortly (GET /ready turns 200 when it is ready)"
            raise ApiError(503, detail, {"Retry-After": "1"})
        if (stalled := self.batcher.stalled) is not None:
            raise ApiError(503, f"{stalled}; retry on another replica", {"Retry-After": "1"})
        return self.batcher

    async def classify(
        self, texts: list[str], receive: Callable[[], Any] | None = None, timing: dict[str, float] | None = None
    ) -> list[dict[str, Any]]:
        """The texts' results from the micro-batcher. With the request's ASGI ``receive``, a client that
        disconnects before its batch forms is taken out of the queue: its texts are never computed.
        ``timing`` is filled in with what the batcher measured (``MicroBatcher.enqueue``)."""
        batcher = self.require_ready()
        try:
            future = batcher.enqueue(texts, timing)
        except QueueFullError as exc:
            raise ApiError(429, str(exc), {"Retry-After": "1"}) from None
        except (BatcherClosedError, ForwardStalledError) as exc:
            raise ApiError(503, f"{exc}; retry on another replica", {"Retry-After": "1"}) from None
        watcher = (
            asyncio.get_running_loop().create_task(_cancel_when_disconnected(receive, future)) if receive else None
        )
        try:
            results = await future
            self.metrics.count_answers(results)
            return results
        except (BatcherClosedError, ForwardStalledError) as exc:
            raise ApiError(503, f"{exc}; retry on another replica", {"Retry-After": "1"}) from None
        except ForwardError:  # the batcher logged the cause; it names internals, so the client is not told it
            raise ApiError(500, "the model failed on this request's texts (the server log has the details)") from None
        except asyncio.CancelledError:
            if watcher is None:
                raise
            if watcher.done() and not watcher.cancelled() and watcher.result():
                raise ApiError(499, "client closed the request before it was computed") from None
            raise
        finally:
            if watcher is not None:
                watcher.cancel()


async def _cancel_when_disconnected(receive: Callable[[], Any], future: asyncio.Future) -> bool:
    """Wait for the client to disconnect (the body is already read); then withdraw its request."""
    for _ in range(16):  # after the body a server sends nothing but the disconnect; never spin on a stray message
        message = await receive()
        if message["type"] == "http.disconnect":
            return future.cancel()
    return False


def create_app(
    config: ServeConfig | None = None, predictor_factory: Callable[[], ServingPredictor] | None = None
) -> FastAPI:
    """The API. ``predictor_factory`` (tests) replaces loading ``config.checkpoint``."""
    config = config or ServeConfig()
    if config.api_key is None:
        # A copy: the caller's config may serve for other apps, each reading the environment afresh.
        config = dataclasses.replace(config, api_key=api_key_from_env())
    metrics = ServeMetrics()
    state = ServingState(config, predictor_factory or _default_factory(config), metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background so /health and /ready answer while the model loads
        # (orchestrators probe them); /predict says 503 until the model is ready.
        loading = asyncio.get_running_loop().create_task(state.load())
        try:
            yield
        finally:
            loading.cancel()
            await state.close()
            if tracer is not None:  # the spans still queued leave before the process does
                await asyncio.to_thread(tracing.shutdown)

    labels = checkpoint_labels(config.checkpoint) if predictor_factory is None else None
    # This app's tracer (None: tracing off), held by its routes: they never depend on the process's tracing later.
    tracer = tracing.tracer() if tracing.start("distrinews-serve", config.otlp_endpoint) else None
    app = FastAPI(
        # FastAPI's own telemetry makes each request's SERVER span, outside every middleware (the 401s and 413s are
        # traced too), from the caller's traceparent; off with tracing off, and never its metrics (ours are Prometheus).
        telemetry={
            "tracing": tracer is not None,
            "tracer_provider": tracing.provider(),
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
        },
        title="DistriNews",
        version=__version__,
        description=f"A text classifier. {labels_sentence(labels)} "
        "Concurrent requests are micro-batched into one forward pass.",
        lifespan=lifespan,
    )
    label_examples(app, labels)
    app.state.serve = state
    app.state.metrics = metrics
    app.state.config = config
    _add_error_handlers(app)
    _add_routes(app, state, config, metrics, tracer)
    # Outermost last: metrics see every answer, including the 401s and 413s below them.
    budget = BodyBudget(config.max_pending_body_bytes)
    metrics.pending_body_bytes.set_function(lambda: float(budget.held))
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, budget=budget, routes=app.router)
    if config.api_key:
        public = PUBLIC_PATHS | {"/metrics"} if config.public_metrics else PUBLIC_PATHS
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, routes=app.router, public=public)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Errors are always JSON, and bad input is never a 500.

    No handler for FastAPI's RequestValidationError: no route declares a parameter or body for
    FastAPI to validate (each parses its own body with ``parse_body``), so it is never raised.
    """

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(
            500, "internal server error (this is a bug, not your input; the server log has the traceback)"
        )


def _add_routes(app: FastAPI, state: ServingState, config: ServeConfig, metrics: ServeMetrics, tracer: Any) -> None:
    """The routes, by kind: the page and the probes, the predictions (the seed's shapes and TEI's), what the
    server says about itself."""
    _add_probe_routes(app, state, config)
    _add_predict_routes(app, state, config, tracer)
    _add_info_routes(app, state, config, metrics)


def _add_probe_routes(app: FastAPI, state: ServingState, config: ServeConfig) -> None:
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        loaded = getattr(state.predictor, "labels", None)
        labels = list(loaded) if loaded else checkpoint_labels(config.checkpoint)
        return HTMLResponse(_index_html().replace("{{LABELS}}", html.escape(labels_sentence(labels))))

    @app.get(
        "/health",
        summary="liveness: the process is up (and whether the model is loaded)",
        responses=declared(503, health=True),
    )
    async def health():
        body = {
            "status": "unhealthy" if state.load_error else "healthy",
            "model_loaded": state.batcher is not None,
            "runtime": state.predictor.runtime if state.predictor is not None else config.runtime,
            "version": __version__,
            "uptime_s": round(time.time() - state.started, 3),
        }
        if state.load_error:
            body["error"] = state.load_error
            return JSONResponse(body, status_code=503)
        return body

    @app.get("/ready", summary="readiness: 200 once the model serves, 503 before", responses=declared(503))
    async def ready():
        state.require_ready()
        return JSONResponse({"status": "ready"}, headers=state.version_header())


def _add_predict_routes(app: FastAPI, state: ServingState, config: ServeConfig, tracer: Any) -> None:
    def answer(content: Any, start: float, timing: dict[str, float], texts: list[str]) -> JSONResponse:
        """The computed answer, with TEI's timing headers; a traced request's stage spans are recorded here too."""
        runtime = state.predictor.runtime if state.predictor is not None else config.runtime
        headers = {
            **state.version_header(),
            **tei.timing_headers(start, timing, sum(len(text) for text in texts), runtime),
        }
        # A Response is sent as it is: FastAPI skips re-validating our own dict against response_model
        # (which still documents the shape in /docs) and jsonable_encoder's walk over it.
        if tracer is None:
            return JSONResponse(content, headers=headers)
        from .tracing import traced_answer

        return traced_answer(tracer, content, headers, timing, len(texts), runtime)

    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        try:
            state.require_ready()
        except ApiError as not_ready:  # in TEI's shape, said in TEI's words; else as the seed API says it
            payload = await _peek(request)
            if tei.is_foreign(payload):
                return tei.error_response(not_ready)
            raise
        payload = await read_object(request, PredictRequest)
        if tei.is_foreign(payload):
            return await predict_foreign(request, payload, start)
        body = validate_body(payload, PredictRequest)
        text = clean_text(body.text, "text", config.max_text_chars)
        timing: dict[str, float] = {}
        (result,) = await state.classify([text], request.receive, timing)
        return answer(result, start, timing, [text])

    async def predict_foreign(request: Request, payload: dict[str, Any], start: float) -> Response:
        try:
            multi_label = bool(getattr(state.predictor, "multi_label", False))
            foreign, top_k = tei.parse(payload, config.max_batch_texts, config.max_text_chars, multi_label)
            texts = foreign.texts
            if not foreign.truncate or foreign.keep_end:
                texts = await asyncio.to_thread(tei.fit, foreign, getattr(state.predictor, "encoder", None))
            timing: dict[str, float] = {}
            try:
                results = await state.classify(texts, request.receive, timing)
            except ApiError as exc:
                if exc.status != 500:
                    raise
                # TEI answers a failed forward pass with 424; the batcher logged the cause for the operator
                raise ApiError(424, "Backend error: inference failed (the server log has the details)") from None
        except ApiError as exc:
            return tei.error_response(exc)
        return answer(tei.answer(foreign, results, top_k), start, timing, foreign.texts)

    route_predict(app, config, predict)

    async def predict_batch(request: Request) -> Response:
        start = time.perf_counter()
        state.require_ready()
        body = await parse_body(request, BatchPredictRequest)
        if not body.texts:
            raise ApiError(422, f"texts is empty: send 1 to {config.max_batch_texts} texts")
        if len(body.texts) > config.max_batch_texts:
            raise ApiError(
                413, f"{len(body.texts)} texts in one request; the limit is {config.max_batch_texts} (split the batch)"
            )
        texts = [clean_text(t, f"texts[{i}]", config.max_text_chars) for i, t in enumerate(body.texts)]
        timing: dict[str, float] = {}
        results = await state.classify(texts, request.receive, timing)
        return answer(results, start, timing, texts)

    route_predict_batch(app, config, predict_batch)


def _add_info_routes(app: FastAPI, state: ServingState, config: ServeConfig, metrics: ServeMetrics) -> None:
    @app.get(
        "/info",
        summary="the model, its labels and metrics, the runtime and the serving limits",
        responses=declared(401, 503),
    )
    async def info():
        state.require_ready()
        assert state.predictor is not None, "set with the batcher, which require_ready checked"
        body = {
            **state.predictor.describe(),
            "version": __version__,
            "batching": {
                "max_batch_size": config.max_batch_size,
                "max_batch_tokens": config.max_batch_tokens or None,
                "max_wait_ms": config.max_wait_ms,
                "max_queue": config.max_queue,
            },
            "limits": {
                "max_batch_texts": config.max_batch_texts,
                "max_text_chars": config.max_text_chars,
                "max_body_bytes": config.max_body_bytes,
            },
            "auth": bool(config.api_key),
        }
        return JSONResponse(body, headers=state.version_header())

    metrics_codes = declared() if config.public_metrics else declared(401)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response, responses=metrics_codes)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _peek(request: Request) -> Any:
    """The body as JSON if it is one (None if not): only to tell which API shape an early error is answered in."""
    try:
        return await read_object(request, PredictRequest)
    except ApiError:
        return None


_INDEX_CACHE: dict[str, str] = {}


def labels_sentence(labels: list[str] | None) -> str:
    """ "Labels: A, B or C." for the page and the API description (the model's own labels)."""
    if not labels:
        return "Labels: the model's (see /info)."
    listed = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} or {labels[-1]}"
    return f"Labels: {listed}."


def _index_html() -> str:
    if "page" not in _INDEX_CACHE:
        _INDEX_CACHE["page"] = (
            resources.files("distrinews.serve").joinpath("static/index.html").read_text(encoding="utf-8")
        )
    return _INDEX_CACHE["page"]


def config_summary(config: ServeConfig) -> dict[str, Any]:
    """The config without the secret, for logs."""
    summary = asdict(config)
    summary["api_key"] = "set" if config.api_key else None
    return summary

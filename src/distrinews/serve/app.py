"""The HTTP API: a FastAPI app factory around the predictor and the micro-batcher.

``create_app(ServeConfig(...))`` builds an app whose lifespan handler loads the model on a worker thread: the server
answers ``/health`` (and ``/ready`` with 503) while the model loads, then serves. Every error is JSON ``{"detail":
"<what to fix>"}`` (``schemas.ApiError``); bad input is a 4xx, never a 500, and reading it is bounded (``limits``).
``POST /predict`` (and ``POST /``, ``/invocations``) also speaks text-embeddings-inference's and Hugging Face's
shapes (``tei``). Each route declares its status codes with an example body (``openapi``); around
the routes sit the middlewares (``middleware``) and the app's own Prometheus registry (``metrics``).

Malformed HTTP itself (an unparsable request line or header, a bad or doubled ``Content-Length``) is answered by
uvicorn's h11 protocol with a plain-text 400 before the app is called; the app cannot change that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import html
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import tracing
from ..predict.predictor import checkpoint_labels
from ..predict.tokens import TextTooLong
from ..version import __version__
from . import tei
from .arrivals import ArrivalsMiddleware
from .limits import clean_text, parse_body, read_object, validate_body
from .metrics import ServeMetrics
from .middleware import PUBLIC_PATHS, ApiKeyMiddleware, BodyBudget, BodyLimitMiddleware, MetricsMiddleware
from .openapi import declared, label_examples, route_predict, route_predict_batch
from .options import ServeConfig, api_key_from_env
from .protocol import ServingPredictor
from .routes import RETRIED_POST_PATHS
from .schemas import ApiError, BatchPredictRequest, PredictRequest, error_response
from .state import ServingState, default_factory

log = logging.getLogger("distrinews.serve")


def create_app(
    config: ServeConfig | None = None, predictor_factory: Callable[[], ServingPredictor] | None = None
) -> FastAPI:
    """The API. ``predictor_factory`` (tests) replaces loading ``config.checkpoint``."""
    config = config or ServeConfig()
    if config.api_key is None:
        # A copy: the caller's config may serve for other apps, each reading the environment afresh.
        config = dataclasses.replace(config, api_key=api_key_from_env())
    metrics = ServeMetrics()
    state = ServingState(config, predictor_factory or default_factory(config), metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Load in the background: /health and /ready answer while the model loads (orchestrators probe them).
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
    app.state.config = config
    _add_error_handlers(app)
    _add_probe_routes(app, state, config)
    routes = _PredictRoutes(state, config, tracer)
    route_predict(app, config, routes.predict)
    route_predict_batch(app, config, routes.predict_batch)
    _add_info_routes(app, state, config, metrics)
    _add_middleware(app, state, config, metrics)
    return app


def _add_middleware(app: FastAPI, state: ServingState, config: ServeConfig, metrics: ServeMetrics) -> None:
    """The body limits, the API key, the metrics and the arrivals count around the routes, innermost first."""
    # Outermost last: metrics see every answer, including the 401s and 413s below them.
    budget = BodyBudget(config.max_pending_body_bytes)
    metrics.pending_body_bytes.set_function(lambda: float(budget.held))
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, budget=budget, routes=app.router)
    if config.api_key:
        public = PUBLIC_PATHS | {"/metrics"} if config.public_metrics else PUBLIC_PATHS
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, routes=app.router, public=public)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost of all: a request counts as on its way to the batcher from its first moment in the app.
    app.add_middleware(ArrivalsMiddleware, arrivals=state.arrivals, paths=RETRIED_POST_PATHS)


def _add_error_handlers(app: FastAPI) -> None:
    """Errors are always JSON, and bad input is never a 500. No handler for FastAPI's RequestValidationError: no
    route declares a parameter or body for FastAPI to validate (each parses its own), so it is never raised."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(
            500, "internal server error (this is a bug, not your input; the server log has the traceback)"
        )


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
        response_model=None,  # a dict or a 503's JSONResponse: FastAPI would make a model of the union
    )
    async def health() -> dict[str, Any] | JSONResponse:
        # Public: whether the process is up and the model loaded, nothing a visitor could match against known
        # flaws (the version, the runtime and the uptime are on /info, behind the key where there is one).
        body: dict[str, Any] = {"status": "healthy", "model_loaded": state.batcher is not None}
        if state.load_error:
            return JSONResponse({**body, "status": "unhealthy", "error": state.load_error}, status_code=503)
        return body

    @app.get("/ready", summary="readiness: 200 once the model serves, 503 before", responses=declared(503))
    async def ready() -> JSONResponse:
        state.require_ready()
        return JSONResponse({"status": "ready"}, headers=state.version_header())


class _PredictRoutes:
    """The handlers of POST /predict (the seed's shape, TEI's and Hugging Face's) and POST /predict/batch."""

    def __init__(self, state: ServingState, config: ServeConfig, tracer: Any) -> None:
        self.state, self.config, self.tracer = state, config, tracer

    def answer(self, content: Any, start: float, timing: dict[str, float], texts: list[str]) -> JSONResponse:
        """The computed answer, with TEI's timing headers; a traced request's stage spans are recorded here too."""
        state = self.state
        runtime = state.predictor.runtime if state.predictor is not None else self.config.runtime
        headers = state.version_header() | tei.timing_headers(start, timing, sum(len(text) for text in texts), runtime)
        # A Response is sent as it is: FastAPI skips re-validating our own dict against response_model
        # (which still documents the shape in /docs) and jsonable_encoder's walk over it.
        if self.tracer is None:
            return JSONResponse(content, headers=headers)
        from .tracing import traced_answer

        return traced_answer(self.tracer, content, headers, timing, len(texts), runtime)

    async def predict(self, request: Request) -> Response:
        start = time.perf_counter()
        try:
            self.state.require_ready()
        except ApiError as not_ready:  # in TEI's shape, said in TEI's words; else as the seed API says it
            payload = None  # the body is read only to tell which shape the error is answered in
            with contextlib.suppress(ApiError):
                payload = await read_object(request, PredictRequest)
            if tei.is_foreign(payload):
                return tei.error_response(not_ready)
            raise
        payload = await read_object(request, PredictRequest)
        if tei.is_foreign(payload):
            return await self.predict_foreign(request, payload, start)
        body = validate_body(payload, PredictRequest)
        text = clean_text(body.text, "text", self.config.max_text_chars)
        timing: dict[str, float] = {}
        (result,) = await self.state.classify([text], request.receive, timing)
        return self.answer(result, start, timing, [text])

    async def predict_foreign(self, request: Request, payload: dict[str, Any], start: float) -> Response:
        state, config = self.state, self.config
        try:
            multi_label = bool(getattr(state.predictor, "multi_label", False))
            foreign, top_k = tei.parse(payload, config.max_batch_texts, config.max_text_chars, multi_label)
            # Measured or cut where every text is tokenized, once the queue has admitted the request (as TEI takes
            # its permit before tokenizing): a refused request costs no tokenizer time.
            encode = tei.encoding(foreign, getattr(state.predictor, "encoder", None))
            timing: dict[str, float] = {}
            try:
                results = await state.classify(foreign.texts, request.receive, timing, encode)
            except TextTooLong as exc:
                raise tei.too_long(exc) from None
            except ApiError as exc:
                if exc.status != 500:
                    raise
                # TEI answers a failed forward pass with 424; the batcher logged the cause for the operator
                raise ApiError(424, "Backend error: inference failed (the server log has the details)") from None
        except ApiError as exc:
            return tei.error_response(exc)
        return self.answer(tei.answer(foreign, results, top_k), start, timing, foreign.texts)

    async def predict_batch(self, request: Request) -> Response:
        start = time.perf_counter()
        config = self.config
        self.state.require_ready()
        body = await parse_body(request, BatchPredictRequest)
        if not body.texts:
            raise ApiError(422, f"texts is empty: send 1 to {config.max_batch_texts} texts")
        if len(body.texts) > config.max_batch_texts:
            why = f"{len(body.texts)} texts in one request; the limit is {config.max_batch_texts} (split the batch)"
            raise ApiError(413, why)
        texts = [clean_text(t, f"texts[{i}]", config.max_text_chars) for i, t in enumerate(body.texts)]
        timing: dict[str, float] = {}
        results = await self.state.classify(texts, request.receive, timing)
        return self.answer(results, start, timing, texts)


def _add_info_routes(app: FastAPI, state: ServingState, config: ServeConfig, metrics: ServeMetrics) -> None:
    @app.get(
        "/info",
        summary="the model, its labels and metrics, the runtime and the serving limits",
        responses=declared(401, 503),
    )
    async def info() -> JSONResponse:
        state.require_ready()
        assert state.predictor is not None, "set with the batcher, which require_ready checked"
        body = {
            **state.predictor.describe(),
            "version": __version__,
            "uptime_s": round(time.time() - state.started, 3),
            "batching": {
                **_settings(config, "max_batch_size", "max_batch_tokens", "max_wait_ms", "max_queue"),
                "concurrent_passes": state.concurrent_passes,
            },
            "limits": _settings(config, "max_batch_texts", "max_text_chars", "max_body_bytes"),
            "auth": bool(config.api_key),
        }
        return JSONResponse(body, headers=state.version_header())

    metrics_codes = declared() if config.public_metrics else declared(401)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response, responses=metrics_codes)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _settings(config: ServeConfig, *names: str) -> dict[str, Any]:
    return {name: getattr(config, name) for name in names}


def labels_sentence(labels: list[str] | None) -> str:
    """ "Labels: A, B or C." for the page and the API description (the model's own labels)."""
    if not labels:
        return "Labels: the model's (see /info)."
    listed = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} or {labels[-1]}"
    return f"Labels: {listed}."


@functools.cache
def _index_html() -> str:
    return resources.files("distrinews.serve").joinpath("static/index.html").read_text(encoding="utf-8")


def config_summary(config: ServeConfig) -> dict[str, Any]:
    """The config without the secret, for logs."""
    summary = asdict(config)
    summary["api_key"] = "set" if config.api_key else None
    return summary

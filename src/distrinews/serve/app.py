"""The HTTP API: a FastAPI app factory around the predictor and the micro-batcher.

``create_app(ServeConfig(...))`` builds an app whose lifespan handler loads the model on a
worker thread: the server answers ``/health`` (and ``/ready`` with 503) while the model
loads, then serves. Every error the app answers is JSON ``{"detail": "<what to fix>"}``; bad
input is a 4xx, never a 500, and parsing it is bounded (``_parse_json``). Metrics live in a
registry of the app's own, so several apps (tests) never collide in the process-global one.

Malformed HTTP itself (an unparsable request line or header, a ``Content-Length`` that is not
a number, two different ``Content-Length`` headers) is answered by the HTTP server (uvicorn's
h11 protocol) with a plain-text 400 before the app is called; the app cannot change that.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import CheckpointError
from .batcher import BatcherClosedError, BatchStats, MicroBatcher, QueueFullError
from .predictor import DEFAULT_RUNTIME

log = logging.getLogger("distrinews.serve")

API_KEY_ENV = "DISTRINEWS_API_KEY"
# Request bodies: JSON arrays/objects nest at most this deep (ours need 2), and a number may
# have at most this many characters (ours have none; Python's int() refuses 4,300+ digits).
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 100
# Reachable without the API key: the demo page (it asks for the key itself) and the probes.
PUBLIC_PATHS = frozenset({"/", "/health", "/ready"})


@dataclass
class ServeConfig:
    checkpoint: str | None = None
    runtime: str = DEFAULT_RUNTIME
    onnx_model: str | None = None
    max_batch_size: int = 32  # texts per forward pass
    max_batch_tokens: int | None = None  # padded tokens per forward pass (longest text x texts); None: no limit
    max_wait_ms: float = 5.0  # how long a batch may wait for company
    max_queue: int = 1024  # texts waiting before the server answers 429
    max_batch_texts: int = 64  # texts in one /predict/batch request (413 above)
    max_text_chars: int = 10_000  # characters of one text after stripping (422 above)
    # 64 texts of 10,000 characters fit even when every character is a 6-byte JSON escape.
    max_body_bytes: int = 4 * 1024 * 1024
    api_key: str | None = field(default=None, repr=False)


# ---------------------------------------------------------------------- schemas
class PredictRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"text": "Apple unveils a new iPhone with a faster chip"}]})
    text: StrictStr = Field(description="the news text to classify (1 to 10,000 characters after stripping)")


class BatchPredictRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"texts": ["Oil prices jump after OPEC cuts output", "Federer wins in straight sets"]}]}
    )
    texts: list[StrictStr] = Field(description="1 to 64 texts (the server's --max-batch-texts)")


class PredictResponse(BaseModel):
    label: str
    label_id: int
    confidence: float
    probabilities: dict[str, float]


class ApiError(Exception):
    """An error with an HTTP status and a message for the person who sent the request."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extra = status, detail, headers, extra


def _error_response(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def _is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` (any parameters, any case) or an ``application/*+json`` type."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class _LongNumber:
    """Stands in for a JSON number spelled with more than MAX_NUMBER_CHARS characters (never converted)."""

    __slots__ = ("chars",)

    def __init__(self, chars: int):
        self.chars = chars


_TOO_DEEP = f"request body is nested too deeply: JSON arrays and objects may nest at most {MAX_JSON_DEPTH} levels"


def _too_deep(payload: Any) -> bool:
    """Whether arrays/objects nest deeper than MAX_JSON_DEPTH: one level at a time, no recursion."""
    level = [payload] if isinstance(payload, (dict, list)) else []
    for _ in range(MAX_JSON_DEPTH):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


def _find_long_number(value: Any, path: tuple[str, ...] = ()) -> tuple[str, _LongNumber] | None:
    """Where the first over-long number is, as ``texts.1`` (recursion is bounded: depth was checked)."""
    for key, child in value.items() if isinstance(value, dict) else enumerate(value):
        if isinstance(child, _LongNumber):
            return ".".join((*path, str(key))), child
        if isinstance(child, (dict, list)) and (found := _find_long_number(child, (*path, str(key)))):
            return found
    return None


def _parse_json(text: str) -> Any:
    """``json.loads`` with bounded work; every failure is a 422 ApiError.

    Nesting: the C decoder recurses once per level and the interpreter's recursion guard stops
    it after ~1,000 levels, so a body nested 100,000 deep (or 4 MB of ``[``) raises
    RecursionError in well under a millisecond, whatever its length; shallower bodies that
    parse are then checked level by level for depth > MAX_JSON_DEPTH. (A character pre-scan
    in Python bounds this too, but measured up to 40x slower than the parse on 4 MB of brackets.)
    Numbers: literals longer than MAX_NUMBER_CHARS are never converted (int() would raise
    "Exceeds the limit (4300 digits)" after quadratic work); the error names where they are.
    """
    long_numbers: list[_LongNumber] = []

    def number(convert: Callable[[str], Any]) -> Callable[[str], Any]:
        def parse(literal: str) -> Any:
            if len(literal) <= MAX_NUMBER_CHARS:
                return convert(literal)
            long_numbers.append(_LongNumber(len(literal)))
            return long_numbers[-1]

        return parse

    try:
        payload = json.loads(text, parse_int=number(int), parse_float=number(float))
    except RecursionError:
        raise ApiError(422, _TOO_DEEP) from None
    except json.JSONDecodeError as exc:
        raise ApiError(422, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    # Text with at most MAX_JSON_DEPTH brackets in all cannot nest deeper: skip the walk (C-speed count).
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(payload):
        raise ApiError(422, _TOO_DEEP)
    if long_numbers:
        found = _find_long_number(payload) if isinstance(payload, (dict, list)) else None
        where, long_number = found or ("body", long_numbers[0])
        raise ApiError(
            422,
            f"{where}: a number of {long_number.chars:,} characters is too long; numbers may have at most "
            f"{MAX_NUMBER_CHARS} (send text as a JSON string)",
        )
    return payload


def _describe_validation_errors(errors: list[dict[str, Any]]) -> str:
    """Pydantic's error list as one sentence: ``texts.2: Input should be a valid string``."""
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request body: " + "; ".join(parts)


# ---------------------------------------------------------------------- metrics
class ServeMetrics:
    """Prometheus metrics in a registry owned by one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "distrinews_http_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "distrinews_http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            ["route", "method", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "distrinews_batch_size", "texts per forward job", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry
        )
        self.batch_tokens = Histogram(
            "distrinews_batch_padded_tokens",
            "padded tokens per forward job (longest text x texts, summed over its passes)",
            buckets=(16, 64, 256, 512, 1024, 2048, 4096, 8192),
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "distrinews_batch_requests",
            "requests coalesced into one forward pass",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )
        stage_buckets = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
        self.inference = Histogram(
            "distrinews_inference_duration_seconds",
            "time of one forward job on the forward thread (pad the batch, model, softmax)",
            buckets=stage_buckets,
            registry=self.registry,
        )
        self.tokenize = Histogram(
            "distrinews_tokenize_duration_seconds",
            "time to tokenize one request's texts on the tokenizer thread",
            buckets=stage_buckets,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "distrinews_queue_duration_seconds",
            "time a tokenized request waited for its forward pass",
            buckets=stage_buckets,
            registry=self.registry,
        )
        self.dropped = Counter(
            "distrinews_requests_dropped",
            "requests taken out of the queue uncomputed because their client went away",
            registry=self.registry,
        )
        self.queue_depth = Gauge("distrinews_queue_depth", "texts waiting for a forward pass", registry=self.registry)
        self.model_loaded = Gauge("distrinews_model_loaded", "1 once the model is loaded and serving", registry=self.registry)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.texts)
        self.batch_requests.observe(stats.requests)
        self.batch_tokens.observe(stats.padded_tokens)
        self.inference.observe(stats.forward_s)
        for seconds in stats.queue_s:
            self.queue_wait.observe(seconds)
        for seconds in stats.tokenize_s:
            self.tokenize.observe(seconds)


# ---------------------------------------------------------------------- ASGI middleware
class MetricsMiddleware:
    """Count and time every HTTP request by route template (not raw path: bounded label values)."""

    def __init__(self, app, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # what the client gets if the app raises before answering

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "<unmatched>"
            key = (label, scope["method"], str(status))
            self.metrics.requests.labels(*key).inc()
            self.metrics.latency.labels(*key).observe(time.perf_counter() - start)


async def _send_json(send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but the public ones (401 otherwise)."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken does not reveal how much of the key was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
            return await self.app(scope, receive, send)
        detail = "invalid API key" if header else "this server requires an API key: send the header 'Authorization: Bearer <key>'"
        await _send_json(send, 401, {"detail": detail}, {"www-authenticate": "Bearer"})


class BodyLimitMiddleware:
    """Answer 413 for a body over ``max_bytes``, whether it declares its length or streams chunks.

    The body is read here (it is small by construction) and handed on whole, so the app
    never sees a partial body.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = {"detail": f"request body too large: the limit is {self.max_bytes:,} bytes (the server's --max-body-bytes)"}
        # uvicorn (h11) already refuses a malformed Content-Length in plain text before calling
        # us; other servers and in-process transports may not, so check it here too.
        values = {v.strip() for k, v in scope["headers"] if k.lower() == b"content-length"}
        declared = None
        if values:
            if len(values) > 1 or not next(iter(values)).isdigit():  # bytes.isdigit(): ASCII digits only, no sign
                shown = ", ".join(sorted(v.decode("latin-1") for v in values))
                return await _send_json(
                    send,
                    400,
                    {"detail": f"invalid Content-Length header ({shown!r}): send one non-negative integer, the body's size in bytes"},
                )
            declared = int(next(iter(values)))
            if declared > self.max_bytes:
                return await _send_json(send, 413, too_big)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _send_json(send, 413, too_big)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and size != declared:
            detail = f"the request body has {size:,} bytes but its Content-Length header says {declared:,}"
            return await _send_json(send, 400, {"detail": detail})
        body, delivered = b"".join(chunks), False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# ---------------------------------------------------------------------- the app
def _describe_load_error(exc: Exception, checkpoint: str | None) -> str:
    """One line for /health and the 503s: what failed and where, never how to unpickle anyway.

    CheckpointError and FileNotFoundError already name the file and say why; anything else is
    summarised by its type and first line, or by its type alone when it repeats torch's advice
    to retry with ``weights_only=False``. The full exception goes to the server log only.
    """
    text = str(exc)
    if "weights_only" in text or "trust the source" in text:
        return f"could not load the model from {checkpoint}: {type(exc).__name__} (refused; the server log has the details)"
    if isinstance(exc, (FileNotFoundError, CheckpointError)):
        return " ".join(text.split())
    first = text.strip().splitlines()[0].strip()[:200] if text.strip() else ""
    return f"could not load the model from {checkpoint}: {type(exc).__name__}" + (f": {first}" if first else "")


def _default_factory(config: ServeConfig) -> Callable[[], Any]:
    def load():
        from .predictor import make_predictor

        if not config.checkpoint:
            raise ValueError("no checkpoint: pass --checkpoint or set MODEL_CHECKPOINT")
        return make_predictor(config.checkpoint, runtime=config.runtime, max_batch_size=config.max_batch_size, onnx_model=config.onnx_model)

    return load


def _json_schema_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI request body for routes that parse their own body (so /docs still shows it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


class ServingState:
    """The model behind the API: loaded in the background, then a micro-batcher in front of it."""

    def __init__(self, config: ServeConfig, load_predictor: Callable[[], Any], metrics: ServeMetrics):
        self.config, self.load_predictor, self.metrics = config, load_predictor, metrics
        self.predictor: Any = None
        self.batcher: MicroBatcher | None = None
        self.load_error: str | None = None
        self.started = time.time()
        metrics.model_loaded.set_function(lambda: 1.0 if self.batcher is not None else 0.0)
        metrics.queue_depth.set_function(lambda: float(self.batcher.queue_depth) if self.batcher is not None else 0.0)

    async def load(self) -> None:
        config = self.config
        try:
            t0 = time.perf_counter()
            predictor = await asyncio.to_thread(self.load_predictor)
            await asyncio.to_thread(predictor.warmup)
            # A predictor that tokenizes apart from its forward pass (ours) gets the tokenizer thread;
            # one that only has predict(texts) (test doubles) gets the texts as they are.
            staged = hasattr(predictor, "encode") and hasattr(predictor, "predict_encoded")
            batcher = MicroBatcher(
                predictor.predict_encoded if staged else predictor.predict,
                config.max_batch_size,
                config.max_wait_ms,
                config.max_queue,
                on_batch=self.metrics.observe_batch,
                encode=predictor.encode if staged else None,
                max_batch_tokens=config.max_batch_tokens,
                on_dropped=self.metrics.dropped.inc,
            )
            await batcher.start()
            self.predictor, self.batcher = predictor, batcher
            log.info("model loaded from %s (runtime %s) in %.1fs; ready", config.checkpoint, predictor.runtime, time.perf_counter() - t0)
        except Exception as exc:  # the server stays up to report it: /health 503, /ready 503
            self.load_error = _describe_load_error(exc, config.checkpoint)
            # The whole exception (and torch's advice in it) goes to the operator's log only.
            log.exception("could not load the model from %s", config.checkpoint)

    async def close(self) -> None:
        if self.batcher is not None:
            # uvicorn has already waited for in-flight requests; this finishes any queued work
            # and stops the worker thread.
            await self.batcher.close()

    def require_ready(self) -> MicroBatcher:
        if self.batcher is None:
            detail = (
                f"model failed to load: {self.load_error}"
                if self.load_error
                else "model is still loading; retry shortly (GET /ready turns 200 when it is ready)"
            )
            raise ApiError(503, detail, {"Retry-After": "1"})
        return self.batcher

    async def classify(self, texts: list[str], receive: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
        """The texts' results from the micro-batcher. With the request's ASGI ``receive``, a client that
        disconnects before its batch forms is taken out of the queue: its texts are never computed."""
        batcher = self.require_ready()
        try:
            future = batcher.enqueue(texts)
        except QueueFullError as exc:
            raise ApiError(429, str(exc), {"Retry-After": "1"}) from None
        except BatcherClosedError as exc:
            raise ApiError(503, f"{exc}; retry on another replica", {"Retry-After": "1"}) from None
        if receive is None:
            return await future
        watcher = asyncio.get_running_loop().create_task(_cancel_when_disconnected(receive, future))
        try:
            return await future
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled() and watcher.result():
                raise ApiError(499, "client closed the request before it was computed") from None
            raise
        finally:
            watcher.cancel()


async def _cancel_when_disconnected(receive: Callable[[], Any], future: asyncio.Future) -> bool:
    """Wait for the client to disconnect (the body is already read); then withdraw its request."""
    for _ in range(16):  # after the body a server sends nothing but the disconnect; never spin on a stray message
        message = await receive()
        if message["type"] == "http.disconnect":
            return future.cancel()
    return False


async def parse_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as ``model``; every way it can be wrong is a 4xx that says how."""
    content_type = request.headers.get("content-type")
    if not _is_json_media_type(content_type):
        got = f"Content-Type {content_type.split(';', 1)[0].strip()!r}" if content_type and content_type.strip() else "no Content-Type"
        raise ApiError(415, f"unsupported media type: got {got}; send the body as JSON with the header 'Content-Type: application/json'")
    raw = await request.body()
    if not raw.strip():
        example = json.dumps(model.model_config.get("json_schema_extra", {}).get("examples", [{}])[0])
        raise ApiError(422, "request body is empty: send a JSON object, e.g. " + example)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(422, f"request body is not valid UTF-8 (byte {exc.start}): send JSON encoded as UTF-8") from None
    payload = _parse_json(text)
    if not isinstance(payload, dict):
        raise ApiError(422, f"request body must be a JSON object, got {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        raise ApiError(422, _describe_validation_errors(exc.errors()), errors=errors) from None


def clean_text(text: str, where: str, max_chars: int) -> str:
    stripped = text.strip()
    if not stripped:
        raise ApiError(422, f"{where} is empty (or only whitespace): send 1 to {max_chars:,} characters of text")
    if len(stripped) > max_chars:
        raise ApiError(422, f"{where} has {len(stripped):,} characters; the limit is {max_chars:,}")
    try:  # JSON may smuggle in lone surrogates ("\ud800") that no tokenizer can encode
        stripped.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(422, f"{where} contains an unpaired surrogate (character {exc.start}): not valid Unicode text") from None
    return stripped


def create_app(config: ServeConfig | None = None, predictor_factory: Callable[[], Any] | None = None) -> FastAPI:
    """The API. ``predictor_factory`` (tests) replaces loading ``config.checkpoint``."""
    config = config or ServeConfig()
    if config.api_key is None:
        config.api_key = os.environ.get(API_KEY_ENV) or None
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

    app = FastAPI(
        title="DistriNews",
        version=__version__,
        description="AG News topic classifier (World, Sports, Business, Sci/Tech). "
        "Concurrent requests are micro-batched into one forward pass.",
        lifespan=lifespan,
    )
    app.state.serve = state
    app.state.metrics = metrics
    app.state.config = config
    _add_error_handlers(app)
    _add_routes(app, state, config, metrics)
    # Outermost last: metrics see every answer, including the 401s and 413s below them.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Errors are always JSON, and bad input is never a 500.

    No handler for FastAPI's RequestValidationError: no route declares a parameter or body for
    FastAPI to validate (each parses its own body with ``parse_body``), so it is never raised.
    """

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error_response(exc.status, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return _error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error_response(500, "internal server error (this is a bug, not your input; the server log has the traceback)")


def _add_routes(app: FastAPI, state: ServingState, config: ServeConfig, metrics: ServeMetrics) -> None:
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(_index_html())

    @app.get("/health", summary="liveness: the process is up (and whether the model is loaded)")
    async def health():
        body = {
            "status": "unhealthy" if state.load_error else "healthy",
            "model_loaded": state.batcher is not None,
            "runtime": config.runtime,
            "version": __version__,
            "uptime_s": round(time.time() - state.started, 3),
        }
        if state.load_error:
            body["error"] = state.load_error
            return JSONResponse(body, status_code=503)
        return body

    @app.get("/ready", summary="readiness: 200 once the model serves, 503 before")
    async def ready():
        state.require_ready()
        return {"status": "ready"}

    @app.post("/predict", response_model=PredictResponse, summary="classify one text", openapi_extra=_json_schema_body(PredictRequest))
    async def predict(request: Request):
        state.require_ready()
        body = await parse_body(request, PredictRequest)
        (result,) = await state.classify([clean_text(body.text, "text", config.max_text_chars)], request.receive)
        # A Response is sent as it is: FastAPI skips re-validating our own dict against response_model
        # (which still documents the shape in /docs) and jsonable_encoder's walk over it.
        return JSONResponse(result)

    @app.post(
        "/predict/batch",
        response_model=list[PredictResponse],
        summary="classify up to 64 texts, results in order",
        openapi_extra=_json_schema_body(BatchPredictRequest),
    )
    async def predict_batch(request: Request):
        state.require_ready()
        body = await parse_body(request, BatchPredictRequest)
        if not body.texts:
            raise ApiError(422, f"texts is empty: send 1 to {config.max_batch_texts} texts")
        if len(body.texts) > config.max_batch_texts:
            raise ApiError(413, f"{len(body.texts)} texts in one request; the limit is {config.max_batch_texts} (split the batch)")
        texts = [clean_text(t, f"texts[{i}]", config.max_text_chars) for i, t in enumerate(body.texts)]
        return JSONResponse(await state.classify(texts, request.receive))

    @app.get("/info", summary="the model, its labels and metrics, the runtime and the serving limits")
    async def info():
        state.require_ready()
        return {
            **state.predictor.describe(),
            "version": __version__,
            "batching": {
                "max_batch_size": config.max_batch_size,
                "max_batch_tokens": config.max_batch_tokens,
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

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


_INDEX_CACHE: dict[str, str] = {}


def _index_html() -> str:
    if "page" not in _INDEX_CACHE:
        _INDEX_CACHE["page"] = resources.files("distrinews.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    return _INDEX_CACHE["page"]


def config_summary(config: ServeConfig) -> dict[str, Any]:
    """The config without the secret, for logs."""
    summary = asdict(config)
    summary["api_key"] = "set" if config.api_key else None
    return summary

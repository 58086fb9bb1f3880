"""What /docs and /openapi.json say: the prediction routes' bodies in every API shape, their answers and limits, the
response examples in the model's own labels, and every error a route can answer (``declared``) with an example body:
the seed's ``{"detail"}`` and, on the routes that take TEI's or Hugging Face's shapes, TEI's ``{"error",
"error_type"}``, as the app answers them (``tests/unit/test_serve_tei.py`` provokes each status on ``/predict``).
The handlers are the app's; this module registers them with their declarations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from .options import ServeConfig
from .routes import PREDICT_BATCH_PATH, PREDICT_PATHS
from .schemas import (
    LOAD_FAILED,
    BatchPredictRequest,
    ErrorDetail,
    HfClassificationRequest,
    MultiLabelPredictResponse,
    Prediction,
    PredictRequest,
    PredictResponse,
    TeiError,
    TeiPredictRequest,
    json_schema_body,
)

_WHY = {
    400: "a Content-Length header that is not one number (TEI's shape: an empty text or batch)",
    401: "no API key, or a wrong one (only when the server has one)",
    413: "more texts, or more bytes, than the server's limits",
    415: "a body that is not declared as JSON",
    422: "a body that is not valid JSON or not of the route's shape, or a text that is empty or too long",
    424: "TEI's shape: the forward pass failed",
    429: "the queue is full: retry after Retry-After seconds",
    503: "no model yet (loading, or it failed to load), or shutting down: retry after Retry-After seconds",
}
_SEED = {
    400: "invalid Content-Length header ('12a'): send one non-negative integer, the body's size in bytes",
    401: "this server requires an API key: send the header 'Authorization: Bearer <key>'",
    413: "65 texts in one request; the limit is 64 (split the batch)",
    415: "unsupported media type: got no Content-Type; send the "
    "body as JSON with the header 'Content-Type: application/json'",
    422: "text is empty (or only whitespace): send 1 to 10,000 characters of text",
    429: "server busy: 1024 texts already queued (limit 1024); retry shortly",
    503: "model is still loading; retry shortly (GET /ready turns 200 when it is ready)",
}
_TEI = {
    400: ("Input validation error: `inputs` cannot be empty", "Empty"),
    413: ("batch size 65 > maximum allowed batch size 64", "Validation"),
    422: ("Input validation error: `inputs` must have less than 64 tokens. Given: 80", "Validation"),
    424: ("Backend error: inference failed (the server log has the details)", "Backend"),
    429: ("server busy: 1024 texts already queued (limit 1024); retry shortly", "Overloaded"),
    503: ("model is still loading; retry shortly (GET /ready turns 200 when it is ready)", "Unhealthy"),
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}


def declared(*codes: int, tei: bool = False, health: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route answering ``codes``: each with why, its body's schema and an example.
    ``tei``: the route takes TEI's shapes too, whose errors are TEI's; ``health``: ``GET /health``'s 503 body."""
    declared_codes: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        examples: dict[str, Any] = {}
        if health:
            body = {"status": "unhealthy", "model_loaded": False, "error": LOAD_FAILED}
            content = {"application/json": {"examples": {"seed": {"value": body}}}}
            declared_codes[code] = {"description": "the model failed to load", "content": content}
            continue
        if code in _SEED:
            examples["seed API"] = {"summary": "the seed's shape", "value": {"detail": _SEED[code]}}
        if tei and code in _TEI:
            value = dict(zip(("error", "error_type"), _TEI[code]))
            examples["TEI"] = {"summary": "TEI's or Hugging Face's shape", "value": value}
        model: Any = (
            ErrorDetail if "TEI" not in examples else TeiError if "seed API" not in examples else ErrorDetail | TeiError
        )
        content = {"application/json": {"examples": examples}}
        declared_codes[code] = {"description": _WHY[code], "model": model, "content": content}
        if code in (429, 503):
            declared_codes[code]["headers"] = _RETRY_AFTER
    return declared_codes


class _RequestRoute(APIRoute):
    """A route whose endpoint takes the ``Request`` and answers a ``Response`` itself (it reads its own body,
    ``limits``): called as it is, without FastAPI's per-request dependency solving and response handling."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request)
            return response

        return handler


def route_predict(app: FastAPI, config: ServeConfig, predict: Any) -> None:
    """POST /predict, / and /invocations: one handler, both API shapes and every error declared in /docs."""
    described = (
        'One text in the seed\'s shape ({"text"}), or text-embeddings-inference\'s ({"inputs"}, with truncate, '
        'truncation_direction, raw_scores) or Hugging Face\'s ({"inputs", "parameters"}), answered in the same shape. '
        f"A batch in TEI's or Hugging Face's shape holds at most {config.max_batch_texts} texts."
    )
    shared: dict[str, Any] = {
        "response_model": PredictResponse | MultiLabelPredictResponse | list[Prediction] | list[list[Prediction]],
        "description": described,
        "openapi_extra": json_schema_body(PredictRequest, TeiPredictRequest, HfClassificationRequest),
        "responses": declared(400, 401, 413, 415, 422, 424, 429, 503, tei=True),
        "route_class_override": _RequestRoute,
    }
    main, *others = PREDICT_PATHS
    app.router.add_api_route(
        main, predict, methods=["POST"], summary="classify a text (or a TEI or Hugging Face batch)", **shared
    )
    for path in others:  # where TEI serves a classifier too (InferenceClient(base_url=...) posts to /)
        summary, operation = f"the same as POST {main} (TEI's POST {path})", f"predict_at_{path.strip('/') or 'root'}"
        app.router.add_api_route(path, predict, methods=["POST"], summary=summary, operation_id=operation, **shared)


def route_predict_batch(app: FastAPI, config: ServeConfig, predict_batch: Any) -> None:
    """POST /predict/batch, its limit stated in /docs."""
    app.router.add_api_route(
        PREDICT_BATCH_PATH,
        predict_batch,
        methods=["POST"],
        response_model=list[PredictResponse | MultiLabelPredictResponse],
        summary=f"classify up to {config.max_batch_texts} texts, results in order",
        openapi_extra=json_schema_body(
            BatchPredictRequest,
            descriptions={"texts": f"1 to {config.max_batch_texts} texts (the server's --max-batch-texts)"},
        ),
        responses=declared(400, 401, 413, 415, 422, 429, 503),
        route_class_override=_RequestRoute,
    )


def label_examples(app: FastAPI, labels: list[str] | None) -> None:
    """The OpenAPI schema's response example in the model's labels (read from the checkpoint's files)."""
    if not labels:
        return
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()  # FastAPI's, cached on the app: the example is added once
        first, share = labels[0], round(1 / len(labels), 4)
        example = {"label": first, "label_id": 0, "confidence": share, "probabilities": dict.fromkeys(labels, share)}
        for name, shown in (("PredictResponse", example), ("Prediction", {"label": first, "score": share})):
            target = schema.get("components", {}).get("schemas", {}).get(name)
            if target is not None:
                target["examples"] = [shown]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

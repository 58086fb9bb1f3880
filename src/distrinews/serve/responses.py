"""Every error a route can answer, declared in the OpenAPI document (FastAPI's ``responses=``) with an
example body: the seed's ``{"detail"}`` and, on the routes that take text-embeddings-inference's or
Hugging Face's shapes, TEI's ``{"error", "error_type"}``. The examples are what the app answers
(``tests/unit/test_serve_tei.py`` provokes each status on ``/predict`` and checks its body's shape)."""

from __future__ import annotations

from typing import Any

from .schemas import LOAD_FAILED, ErrorDetail, TeiError

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
            error, error_type = _TEI[code]
            examples["TEI"] = {
                "summary": "TEI's or Hugging Face's shape",
                "value": {"error": error, "error_type": error_type},
            }
        model: Any = (
            ErrorDetail if "TEI" not in examples else TeiError if "seed API" not in examples else ErrorDetail | TeiError
        )
        entry: dict[str, Any] = {
            "description": _WHY[code],
            "model": model,
            "content": {"application/json": {"examples": examples}},
        }
        if code in (429, 503):
            entry["headers"] = _RETRY_AFTER
        declared_codes[code] = entry
    return declared_codes

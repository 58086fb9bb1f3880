"""The ASGI middlewares around the app: request metrics, the API key, the body size limit.

They answer before any route runs, so their errors are written here as raw ASGI messages
(JSON ``{"detail": ...}``, like every error the app answers).
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from .metrics import ServeMetrics

# Reachable without the API key: the demo page (it asks for the key itself) and the probes.
PUBLIC_PATHS = frozenset({"/", "/health", "/ready"})


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


async def send_json(send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but the public ones (401 otherwise)."""

    def __init__(self, app, api_key: str, public: frozenset[str] = PUBLIC_PATHS):
        self.app, self.api_key, self.public = app, api_key.encode(), public

    async def __call__(self, scope, receive, send):
        # Public for reading only: POST / is TEI's prediction route, which needs the key like /predict.
        if scope["type"] != "http" or (scope["path"] in self.public and scope["method"] in ("GET", "HEAD")):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken does not reveal how much of the key was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
            return await self.app(scope, receive, send)
        detail = "invalid API key" if header else "this server requires an API key: send the header 'Authorization: Bearer <key>'"
        await send_json(send, 401, {"detail": detail}, {"www-authenticate": "Bearer"})


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
                return await send_json(
                    send,
                    400,
                    {"detail": f"invalid Content-Length header ({shown!r}): send one non-negative integer, the body's size in bytes"},
                )
            declared = int(next(iter(values)))
            if declared > self.max_bytes:
                return await send_json(send, 413, too_big)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_json(send, 413, too_big)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and size != declared:
            detail = f"the request body has {size:,} bytes but its Content-Length header says {declared:,}"
            return await send_json(send, 400, {"detail": detail})
        body, delivered = b"".join(chunks), False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

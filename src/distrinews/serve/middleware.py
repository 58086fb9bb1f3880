"""The ASGI middlewares around the app: request metrics, the API key, the body limits. They answer before any route
runs, so their errors are raw ASGI messages here (JSON ``{"detail": ...}``, as every error the app answers).

A body is read only for a route that takes it (405 unread otherwise, the public probes included), and only from a
client with the key where one is set (401 first, unread); it must arrive within ``--body-timeout``
(``connections``), and the bodies all requests in progress hold stay under ``--max-pending-body-bytes``.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import ServeMetrics
from .schemas import quoted

# Reachable without the API key: the demo page (it asks for the key itself) and the probes.
PUBLIC_PATHS = frozenset({"/", "/health", "/ready"})
# Prometheus label values for the method: h11 accepts any token as one, and each new value is a new series.
METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})
# The scope key where the connection protocol records an answer it wrote itself (the body timeout's 408).
PROTOCOL_STATUS = "distrinews.protocol_status"


class MetricsMiddleware:
    """Count and time every HTTP request by route template (not raw path: bounded label values)."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics
        # Each series' counter and histogram, looked up once: the keys are bounded (route templates, METHOD_LABELS,
        # status codes), and a labels() lookup per request costs a lock and a tuple of strings.
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status: int | None = None

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        except BaseException:
            status = 500 if status is None else status  # what uvicorn answers when the app raises before answering
            raise
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "<unmatched>"  # the app's route templates: a fixed set
            method = scope["method"] if scope["method"] in METHOD_LABELS else "other"
            # No answer from the app: the protocol's own (408), else the client left first (nginx's 499).
            status = status if status is not None else scope.get(PROTOCOL_STATUS, 499)
            key = (label, method, status)
            if (series := self._series.get(key)) is None:
                labels = (label, method, str(status))
                series = self._series[key] = (
                    self.metrics.requests.labels(*labels),
                    self.metrics.latency.labels(*labels),
                )
            series[0].inc()
            series[1].observe(time.perf_counter() - start)


async def send_json(send: Send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class RouteMethods:
    """Which methods the app's routes serve at a request's path. A (path, method) pair that a route without path
    parameters serves is remembered, so served requests skip the walk over the routes: at most the routes' own pairs
    are remembered, whatever clients send."""

    def __init__(self, routes: Router):
        self.routes = routes
        self._served: set[tuple[str, str]] = set()

    def not_served(self, scope: Scope) -> list[str] | None:
        """The methods the path serves when the request's is not one of them (None: served, or no such path)."""
        key = (scope["path"], scope["method"])
        if key in self._served:
            return None
        allowed: set[str] = set()
        for route in self.routes.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                if "{" not in getattr(route, "path", "{"):
                    self._served.add(key)
                return None
            if match is Match.PARTIAL:
                allowed |= getattr(route, "methods", None) or set()
        return sorted(allowed) if allowed else None


class ApiKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but the public ones (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_key: str, routes: Router, public: frozenset[str] = PUBLIC_PATHS):
        self.app, self.api_key, self.routes, self.public = app, api_key.encode(), RouteMethods(routes), public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Public for reading only: POST / is TEI's prediction route, which needs the key like /predict. A method
        # a public path does not serve goes on to its 405 (body unread), key or not.
        public = scope["type"] == "http" and scope["path"] in self.public
        if scope["type"] != "http" or (
            public and (scope["method"] in ("GET", "HEAD") or self.routes.not_served(scope) is not None)
        ):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken does not reveal how much of the key was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
            return await self.app(scope, receive, send)
        missing = "this server requires an API key: send the header 'Authorization: Bearer <key>'"
        await send_json(send, 401, {"detail": "invalid API key" if header else missing}, {"www-authenticate": "Bearer"})


class BodyBudget:
    """The bytes of request bodies held by all requests in progress (one per app), and their limit."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes`` (declared or streamed); 405 (unread) for a method its path does not serve;
    503 for a body that would take the bytes all requests in progress hold past ``budget.limit``. The body is read
    here and handed on whole (the app never sees part of one); its bytes count until the request is answered."""

    def __init__(self, app: ASGIApp, max_bytes: int, budget: BodyBudget, routes: Router):
        self.app, self.max_bytes, self.budget, self.routes = app, max_bytes, budget, RouteMethods(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if (allowed := self.routes.not_served(scope)) is not None:
            detail = f"Method Not Allowed: {quoted(scope['path'])} serves {' and '.join(allowed)} only"
            return await send_json(send, 405, {"detail": detail}, {"allow": ", ".join(allowed)})
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        held = [0]  # the bytes this request adds to the budget's, given back when it is answered
        try:
            await self._read_then_call(scope, receive, send, held)
        finally:
            self.budget.held -= held[0]

    async def _read_then_call(self, scope: Scope, receive: Receive, send: Send, held: list[int]) -> None:
        limit = f"the limit is {self.max_bytes:,} bytes (the server's --max-body-bytes)"
        too_big = {"detail": f"request body too large: {limit}"}
        # uvicorn (h11) already refuses a malformed Content-Length in plain text before calling
        # us; other servers and in-process transports may not, so check it here too.
        values = {v.strip() for k, v in scope["headers"] if k.lower() == b"content-length"}
        declared = None
        if values:
            if len(values) > 1 or not next(iter(values)).isdigit():  # bytes.isdigit(): ASCII digits only, no sign
                shown = quoted(", ".join(sorted(v.decode("latin-1") for v in values)))
                said = "send one non-negative integer, the body's size in bytes"
                detail = f"invalid Content-Length header ({shown}): {said}"
                return await send_json(send, 400, {"detail": detail})
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
            if self.budget.held + len(chunk) > self.budget.limit:
                detail = (
                    f"server busy: the request bodies in progress hold {self.budget.held:,} bytes "
                    f"(the server's --max-pending-body-bytes is {self.budget.limit:,}); retry shortly"
                )
                return await send_json(send, 503, {"detail": detail}, {"retry-after": "1"})
            self.budget.held += len(chunk)
            held[0] += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and size != declared:
            detail = f"the request body has {size:,} bytes but its Content-Length header says {declared:,}"
            return await send_json(send, 400, {"detail": detail})
        body, delivered = b"".join(chunks), False
        chunks.clear()

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

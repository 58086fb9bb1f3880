"""A request's stage spans: tokenize, queue, forward and response, under the request's span.

Imported only when tracing is on (``create_app``). The request's SERVER span is FastAPI's own telemetry (given this
process's tracer provider): the app's outermost layer, a child of the caller's W3C ``traceparent``, named by the
route template, with the status.

The stages are not spans opened where they run: the micro-batcher computes many requests in one forward pass on its
own thread, and already measures each request's tokenize, queue and inference times (``enqueue``'s ``timing``).
``traced_answer`` turns those into child spans of the request with their real start and end times, the forward span
carrying its batch (texts, requests, padded tokens, passes, and a batch number shared by the requests computed
together). So a request's own trace shows its forward pass, where a span per batch linked from each request would
belong to no request's trace; and the batcher's threads do no tracing work.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

_NS = 1_000_000_000


def traced_answer(
    tracer: trace.Tracer, content: Any, headers: dict[str, str], timing: dict[str, float], texts: int, runtime: str
) -> JSONResponse:
    """The answer, after the current request's stage spans from the batcher's ``timing`` (perf_counter's clock)."""
    if "done" not in timing or not trace.get_current_span().is_recording():
        return JSONResponse(content, headers=headers)
    # perf_counter has no epoch: place the batcher's times on the wall clock by their distance from now.
    now_ns, now = time.time_ns(), time.perf_counter()
    done = now_ns - int((now - timing["done"]) * _NS)
    forward = done - int(timing["inference_s"] * _NS)
    queued = forward - int(timing["queue_s"] * _NS)
    tokenizing = queued - int(timing["tokenize_s"] * _NS)
    batch = {
        "distrinews.batch.id": int(timing["batch"]),
        "distrinews.batch.texts": int(timing["batch_texts"]),
        "distrinews.batch.requests": int(timing["batch_requests"]),
        "distrinews.batch.padded_tokens": int(timing["padded_tokens"]),
        "distrinews.batch.passes": int(timing["passes"]),
        "distrinews.runtime": runtime,
    }
    counts = {"distrinews.texts": texts, "distrinews.tokens": int(timing["tokens"])}
    stages: tuple[tuple[str, int, int, dict[str, Any]], ...] = (
        ("distrinews.tokenize", tokenizing, queued, counts),
        ("distrinews.queue", queued, forward, {}),
        ("distrinews.forward", forward, done, batch),
    )
    for name, start, end, attributes in stages:  # children of the current span: the request's
        tracer.start_span(name, start_time=start, attributes=attributes).end(end_time=end)
    return _TracedResponse(content, headers, tracer.start_span("distrinews.response", start_time=done))


class _TracedResponse(JSONResponse):
    """A JSON answer that ends the response span as its last bytes go to the server (FastAPI's request span
    ends just after, when the server has taken them)."""

    def __init__(self, content: Any, headers: dict[str, str], span: trace.Span) -> None:
        super().__init__(content, headers=headers)
        self.span = span

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def ending(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.span.set_attribute("http.response.status_code", self.status_code)
                self.span.end()
            await send(message)

        await super().__call__(scope, receive, ending)

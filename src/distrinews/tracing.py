"""OpenTelemetry traces, exported over OTLP/HTTP when an endpoint is set, and nothing at all when not.

Tracing is on in a process when ``start`` is given an endpoint (``--otlp-endpoint``) or finds the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (and ``OTEL_SDK_DISABLED`` is not ``true``).
The exporter reads the other standard variables itself; ``OTEL_SERVICE_NAME`` overrides each command's service name.
When it is off, nothing of OpenTelemetry's is imported and ``span`` hands back one shared do-nothing context manager.
The packages are the optional extra ``tracing``; asking for tracing without them is a one-line error. Every module
may import this one; it imports nothing of the package's but ``errors`` (and the ``version`` leaf).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .errors import ConfigError

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
INSTALL = "pip install 'distrinews[tracing]'"
# How long the end of a command (or of the server) waits for its last spans to leave: within a pod's grace period.
SHUTDOWN_TIMEOUT_S = 5.0
# The modules the extra brings: the SDK and the OTLP/HTTP exporter (the API and the protobuf types come with them).
_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")

_NOOP = contextlib.nullcontext()
_tracer: Any = None  # the SDK's Tracer while tracing is on in this process
_provider: Any = None


def wanted(endpoint: str | None = None) -> bool:
    """Whether tracing is asked for: an endpoint given, or the standard variables set (and the SDK not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(endpoint or os.environ.get(ENDPOINT_ENV) or os.environ.get(TRACES_ENDPOINT_ENV))


def require(what: str) -> None:
    """Raise a one-line ConfigError naming the extra when OpenTelemetry is not installed."""
    for module in _MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise ConfigError(
                f"{what} needs OpenTelemetry, which is not installed: {INSTALL} (missing module {module})"
            )


def check_endpoint(endpoint: str | None, flag: str = "--otlp-endpoint") -> None:
    """Refuse, in one line, an endpoint that is not an OTLP/HTTP URL (the exporter would only log its failures)."""
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"{flag} must be an http:// or https:// URL (OTLP/HTTP, e.g. http://127.0.0.1:4318), got {endpoint!r}"
        )


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a base endpoint, as the standard variable means it (``/v1/traces`` appended)."""
    return endpoint.rstrip("/") + "/v1/traces"


def start(service_name: str, endpoint: str | None = None) -> bool:
    """Turn tracing on for this process when it is wanted; returns whether it is on. ``endpoint``: a base URL like
    ``OTEL_EXPORTER_OTLP_ENDPOINT``'s, winning over the variables. Spans leave in batches from a background thread."""
    if _tracer is not None:
        return True
    if not wanted(endpoint):
        return False
    require("tracing (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, but what is passed here wins over them.
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint)) if endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    return True


def use(provider: Any) -> None:
    """Trace into ``provider`` (an SDK ``TracerProvider``; ``start`` makes one that exports over OTLP)."""
    global _tracer, _provider
    from .version import __version__

    _provider, _tracer = provider, provider.get_tracer("distrinews", __version__)


def tracer() -> Any:
    """The SDK tracer while tracing is on, else None."""
    return _tracer


def provider() -> Any:
    """The SDK tracer provider while tracing is on, else None."""
    return _provider


def shutdown(timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Send the spans not yet exported and turn tracing off, waiting ``timeout`` seconds at most (then they are
    dropped, in one line). The SDK's own shutdown may wait 30 s and more on a collector that never answers, past a
    stopping pod's grace period: so it runs on a daemon thread of its own."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is None:
        return
    ending = threading.Thread(target=provider.shutdown, name="distrinews-tracing-shutdown", daemon=True)
    ending.start()
    ending.join(timeout)
    if ending.is_alive():
        print(
            f"distrinews: warning: tracing: the spans not yet exported are dropped (the collector did not take them"
            f" within {timeout:g} s)",
            file=sys.stderr,
        )


@contextlib.contextmanager
def session(service_name: str, endpoint: str | None = None) -> Iterator[bool]:
    """``start`` for the length of a ``with`` block (a command, a worker process), then ``shutdown``."""
    started = start(service_name, endpoint)
    try:
        yield started
    finally:
        if started:
            shutdown()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span around a ``with`` block, the current span's child; when tracing is off, a shared no-op."""
    if _tracer is None:
        return _NOOP
    current: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(name, attributes=attributes)
    return current


def traced(
    name: str, attributes: Callable[..., dict[str, Any]], outcome: Callable[[Any], dict[str, Any]] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a function with a span around each call: ``attributes(*args, **kwargs)`` and ``outcome(result)`` are
    its attributes. When tracing is off the call goes straight through, and neither is called."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None:
                return fn(*args, **kwargs)
            with _tracer.start_as_current_span(name, attributes=attributes(*args, **kwargs)) as current:
                result = fn(*args, **kwargs)
                if outcome is not None:
                    current.set_attributes(outcome(result))
                return result

        return call

    return decorate


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current span's ``traceparent`` (and ``tracestate``) to outgoing HTTP headers, whoever traces (this
    process, or a client library's caller with its own OpenTelemetry); where OpenTelemetry is not loaded, nothing is
    imported and ``headers`` is handed back as it is."""
    if "opentelemetry.context" in sys.modules:
        from opentelemetry.propagate import inject as propagate

        propagate(headers)
    return headers

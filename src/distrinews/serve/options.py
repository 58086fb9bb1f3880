"""The server's command-line options, shared by ``distrinews serve`` and the slim ``python -m distrinews.serve``.
``MODEL_CHECKPOINT`` and ``PORT`` stand in for ``--checkpoint`` and ``--port``, as container platforms set them.
The checks import nothing heavy (torch only to check that ``--runtime torch-bf16`` runs in hardware here).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tracing
from ..errors import ConfigError
from ..options import Option, add_options, check_options, fill_from_env, options_of
from ..options.shared import MIN_CONFIDENCE, OTLP_ENDPOINT, RUNTIME, SERVE_CHECKPOINT, SERVE_MAX_BATCH_TOKENS, THREADS

API_KEY_ENV = "DISTRINEWS_API_KEY"
DEFAULT_PORT = 7860
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class ServeOptionError(ValueError):
    """A server option is missing or out of range; the message says which and what to use."""


def _flag(default: Any, help: str | None = None, **declared: Any) -> Any:
    """A field that is also the command-line flag ``--field-name``, declared here only (``options.Option``)."""
    return Option(default=default, help=help, **declared).field()


@dataclass
class ServeConfig:
    """Every option of the server: its flags (``add_arguments``) are built from these fields, in this order."""

    checkpoint: str | None = SERVE_CHECKPOINT.field()
    host: str = _flag("127.0.0.1", "interface to listen on (0.0.0.0 in a container)")
    port: int | None = _flag(
        None, f"port (default: $PORT, else {DEFAULT_PORT})", type=int, minimum=0, maximum=65535, env="PORT"
    )
    runtime: str = RUNTIME.field()
    onnx_model: str | None = _flag(
        None, "ONNX file for --runtime onnx or onnx-int8 (instead of the checkpoint's or the cache's)"
    )
    max_batch_size: int = _flag(32, "texts per forward pass", minimum=1)
    max_batch_tokens: int | None = SERVE_MAX_BATCH_TOKENS.field()
    max_wait_ms: float = _flag(5.0, "longest a batch waits for requests known to be on their way", minimum=0)
    max_queue: int = _flag(1024, "texts waiting before new requests get 429", minimum=1)
    max_batch_texts: int = _flag(64, "texts allowed in one /predict/batch request (413 above)", minimum=1)
    max_text_chars: int = _flag(10_000, "characters allowed in one text after stripping (422 above)", minimum=1)
    # 64 texts of 10,000 characters fit even when every character is a 6-byte JSON escape.
    max_body_bytes: int = _flag(4 * 1024 * 1024, "request body cap in bytes (413 above)", minimum=1)
    timeout_graceful_shutdown: float = _flag(30.0, "seconds SIGTERM waits for in-flight requests")
    threads: int = THREADS.field()
    concurrent_passes: int = _flag(
        0,
        "under concurrency, forward passes run side by side on one core each (ONNX runtimes; 0: one per usable "
        "core, the CPU quota's where one is set, unless --threads is set; 1: one pass at a time on every core)",
        minimum=0,
    )
    header_timeout: float = _flag(
        10.0,
        "seconds a connection has to send a request's headers (from "
        "connect, or from the previous answer); then it is closed",
        above=0,
    )
    max_connections: int = _flag(
        1000,
        "open connections at most; one more is answered 503 (JSON, Retry-After) and closed before it is read",
        minimum=1,
    )
    # Whole body, not nginx's time between two reads (client_body_timeout, also 60 s): a client sending a byte every
    # 59 s would pass that forever. 60 s for at most --max-body-bytes (4 MiB) asks for 70 KB/s.
    body_timeout: float = _flag(
        60.0,
        "seconds a request's body has to arrive in full, from the "
        "end of its headers; then 408 and the connection is closed",
        above=0,
    )
    # nginx's send_timeout (60 s): between two reads of the client, not for the whole answer, as an answer of the
    # prediction routes is a few KB, and a slow reader still advances.
    send_timeout: float = _flag(
        60.0,
        "seconds a client may leave an answer unread (no byte of it taken) while some of it waits in the server; then "
        "the connection is aborted and the answer dropped",
        above=0,
    )
    # 1,000 connections x a 4 MiB body would be 4 GiB, twice deploy/k8s/serve.yaml's memory limit; 256 MiB is 64 bodies
    # of the largest size, or thousands of ordinary ones.
    max_pending_body_bytes: int = _flag(
        256 * 1024 * 1024,
        "request body bytes all requests in progress may hold together; a body that would go over gets 503",
    )
    # A forward pass takes milliseconds on a CPU batch of --max-batch-tokens 512, seconds at most for a GPU's large
    # batches.
    forward_timeout: float = _flag(
        30.0, "seconds one forward pass may run; past that /ready and new requests answer 503 until it returns", above=0
    )
    log_level: str = _flag("info", choices=LOG_LEVELS)
    no_access_log: bool = _flag(False, "do not log every request", switch=True)
    otlp_endpoint: str | None = OTLP_ENDPOINT.field()
    min_confidence: str | None = MIN_CONFIDENCE.field()
    public_metrics: bool = _flag(
        False,
        "answer GET /metrics without the API key (Prometheus scraping pods by annotation sends none)",
        switch=True,
    )
    # Not a flag: create_app reads $DISTRINEWS_API_KEY (api_key_from_env), which keeps the secret off the command line.
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        """The config of parsed ``add_arguments`` flags."""
        return cls(**{option.name: getattr(args, option.name) for option in OPTIONS})


OPTIONS = options_of(ServeConfig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per ServeConfig field that is a flag, with the field's default, type, range and help."""
    add_options(p, OPTIONS)


def api_key_from_env() -> str | None:
    """$DISTRINEWS_API_KEY stripped (no header value can carry the whitespace); None when unset. Set but blank is
    refused: the server is meant to be guarded (an empty Kubernetes secret gives this), and would fail open."""
    raw = os.environ.get(API_KEY_ENV)
    if raw is None:
        return None
    if not raw.strip():
        raise ServeOptionError(
            f"{API_KEY_ENV} is set but empty: set it to the key clients must send, or unset it to serve without one"
        )
    return raw.strip()


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (a name other than localhost counts as reachable)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate(args: argparse.Namespace) -> None:
    """Fill ``checkpoint`` and ``port`` from the environment and check every option (the checkpoint's
    contents are the caller's to check: that needs the runtime's libraries)."""
    fill_from_env(args, OPTIONS, ServeOptionError)
    if not args.checkpoint:
        raise ServeOptionError("serve needs a checkpoint: --checkpoint runs/NAME/best (or set MODEL_CHECKPOINT)")
    if not Path(args.checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    if args.port is None:
        args.port = DEFAULT_PORT
    check_options(args, OPTIONS, ServeOptionError)
    if args.max_pending_body_bytes < args.max_body_bytes:
        raise ServeOptionError(
            f"--max-pending-body-bytes ({args.max_pending_body_bytes}) "
            f"must be at least --max-body-bytes ({args.max_body_bytes})"
        )
    api_key_from_env()
    from ..predict.confidence import ConfidenceThreshold
    from ..predict.predictor import checkpoint_labels

    try:
        tracing.check_endpoint(args.otlp_endpoint)
        if tracing.wanted(args.otlp_endpoint):
            tracing.require("serve --otlp-endpoint (or $OTEL_EXPORTER_OTLP_ENDPOINT)")
        # --min-confidence names only labels the checkpoint has, where its files say which
        threshold = ConfidenceThreshold.parse(args.min_confidence)
        if threshold is not None and (labels := checkpoint_labels(args.checkpoint)):
            threshold.for_labels(labels)
    except ConfigError as exc:
        raise ServeOptionError(str(exc)) from None
    if args.onnx_model and not args.runtime.startswith("onnx"):
        raise ServeOptionError("--onnx-model needs --runtime onnx or onnx-int8")
    if args.runtime == "torch-bf16":
        _check_bf16()
    if args.onnx_model and not Path(args.onnx_model).is_file():
        raise FileNotFoundError(f"ONNX model {args.onnx_model} does not exist")


def _check_bf16() -> None:
    try:
        import torch
    except ImportError:
        raise ServeOptionError(
            "--runtime torch-bf16 needs torch, which is not installed here; use --runtime onnx-int8 or onnx"
        ) from None
    from ..predict.runtimes import bf16_refusal

    if (why := bf16_refusal("cuda" if torch.cuda.is_available() else "cpu")) is not None:
        raise ServeOptionError(why)

"""The server's command-line options, shared by ``distrinews serve`` and the slim ``python -m distrinews.serve``.

``MODEL_CHECKPOINT`` and ``PORT`` stand in for ``--checkpoint`` and ``--port`` (as in the
reference system, and as container platforms set them). Checks here import nothing heavy
(torch only to check that ``--runtime torch-bf16`` runs in hardware here).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import tracing
from ..errors import ConfigError
from ..predict.runtimes import DEFAULT_RUNTIME, RUNTIMES

API_KEY_ENV = "DISTRINEWS_API_KEY"
DEFAULT_PORT = 7860
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class ServeOptionError(ValueError):
    """A server option is missing or out of range; the message says which and what to use."""


def _flag(default: Any, help: str | None = None, **argparse_kwargs: Any) -> Any:
    """A field that is also the command-line flag ``--field-name``: its default and help live here only."""
    return field(default=default, metadata={"flag": True, "help": help, "argparse": argparse_kwargs})


@dataclass
class ServeConfig:
    """Every option of the server: its flags (``add_arguments``) are built from these fields, in this order."""

    checkpoint: str | None = _flag(
        None, "best/ directory, step-N directory or a legacy .pt file (default: $MODEL_CHECKPOINT)"
    )
    host: str = _flag("127.0.0.1", "interface to listen on (0.0.0.0 in a container)")
    port: int | None = _flag(None, f"port (default: $PORT, else {DEFAULT_PORT})", type=int)
    runtime: str = _flag(
        DEFAULT_RUNTIME,
        f"inference runtime (default: {DEFAULT_RUNTIME}; auto = onnx-int8 where the checkpoint's "
        "int8 model passed its accuracy check against fp32 (made and checked at the first start "
        "if missing, into the cache, never the checkpoint), else torch; onnx-int8/onnx use "
        "CHECKPOINT/model.int8.onnx / model.onnx where it ships them, else the cache's, made at start "
        "if missing; torch-bf16 only where the CPU or GPU computes bf16 in hardware)",
        choices=RUNTIMES,
    )
    onnx_model: str | None = _flag(
        None, "ONNX file for --runtime onnx or onnx-int8 (instead of the checkpoint's or the cache's)"
    )
    max_batch_size: int = _flag(32, "texts per forward pass")
    # 512: on a CPU, small batches of similar lengths beat one batch padded to its longest text (32 clients on 2 cores,
    # benchmarks/README.md: 1.7x the throughput of no limit for int8, 1.4x for PyTorch); on a GPU raise it (e.g. 16384)
    max_batch_tokens: int = _flag(
        512, "padded tokens per forward pass (the batch's longest text x its texts); 0: no limit"
    )
    max_wait_ms: float = _flag(5.0, "longest a batch waits for requests known to be on their way")
    max_queue: int = _flag(1024, "texts waiting before new requests get 429")
    max_batch_texts: int = _flag(64, "texts allowed in one /predict/batch request (413 above)")
    max_text_chars: int = _flag(10_000, "characters allowed in one text after stripping (422 above)")
    # 64 texts of 10,000 characters fit even when every character is a 6-byte JSON escape.
    max_body_bytes: int = _flag(4 * 1024 * 1024, "request body cap in bytes (413 above)")
    timeout_graceful_shutdown: float = _flag(30.0, "seconds SIGTERM waits for in-flight requests")
    threads: int = _flag(
        0,
        "CPU threads of the model's forward pass (0: the runtime's default, all cores; under a CPU quota, "
        "as many as the quota allows)",
    )
    concurrent_passes: int = _flag(
        0,
        "under concurrency, forward passes run side by side on one core each (ONNX runtimes; 0: one per usable "
        "core, the CPU quota's where one is set, unless --threads is set; 1: one pass at a time on every core)",
    )
    header_timeout: float = _flag(
        10.0,
        "seconds a connection has to send a request's headers (from "
        "connect, or from the previous answer); then it is closed",
    )
    max_connections: int = _flag(
        1000, "open connections at most; one more is answered 503 (JSON, Retry-After) and closed before it is read"
    )
    # Whole body, not nginx's time between two reads (client_body_timeout, also 60 s): a client sending a byte every
    # 59 s would pass that forever. 60 s for at most --max-body-bytes (4 MiB) asks for 70 KB/s.
    body_timeout: float = _flag(
        60.0,
        "seconds a request's body has to arrive in full, from the "
        "end of its headers; then 408 and the connection is closed",
    )
    # nginx's send_timeout (60 s): between two reads of the client, not for the whole answer, as an answer of the
    # prediction routes is a few KB, and a slow reader still advances.
    send_timeout: float = _flag(
        60.0,
        "seconds a client may leave an answer unread (no byte of it taken) while some of it waits in the server; then "
        "the connection is aborted and the answer dropped",
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
        30.0, "seconds one forward pass may run; past that /ready and new requests answer 503 until it returns"
    )
    log_level: str = _flag("info", choices=LOG_LEVELS)
    no_access_log: bool = _flag(False, "do not log every request", action="store_true")
    otlp_endpoint: str | None = _flag(
        None,
        "send OpenTelemetry traces over OTLP/HTTP to this base URL (e.g. http://127.0.0.1:4318; default: "
        "$OTEL_EXPORTER_OTLP_ENDPOINT; neither: no tracing); needs the 'tracing' extra",
    )
    min_confidence: str | None = _flag(
        None,
        'answers whose top probability is below this are marked "confident": false (the label is still given) and '
        "counted in /metrics: a number for every label, LABEL=NUMBER pairs (World=0.8,Sports=0.6), or both "
        "(0.5,World=0.8)",
    )
    public_metrics: bool = _flag(
        False,
        "answer GET /metrics without the API key (Prometheus scraping pods by annotation sends none)",
        action="store_true",
    )
    # Not a flag: create_app reads $DISTRINEWS_API_KEY (api_key_from_env), which keeps the secret off the command line.
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        """The config of parsed ``add_arguments`` flags."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.metadata.get("flag")})


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per ServeConfig field that is a flag, with the field's default, type and help."""
    for f in fields(ServeConfig):
        if not f.metadata.get("flag"):
            continue
        kwargs = {"default": f.default, "help": f.metadata["help"], **f.metadata["argparse"]}
        if "action" not in kwargs and isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
            kwargs.setdefault("type", type(f.default))
        if kwargs["help"] is None:
            del kwargs["help"]
        p.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def api_key_from_env() -> str | None:
    """$DISTRINEWS_API_KEY without surrounding whitespace (no header value can carry it); None when unset.

    Set but blank is refused: the variable says the server is meant to be guarded (an empty Kubernetes
    secret gives exactly this), and serving without a key instead would fail open.
    """
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


def _env_port() -> int:
    raw = os.environ.get("PORT")
    if raw is None or raw == "":
        return DEFAULT_PORT
    try:
        return int(raw)
    except ValueError:
        raise ServeOptionError(f"PORT={raw!r} is not a port number") from None


def validate(args: argparse.Namespace) -> None:
    """Fill ``checkpoint`` and ``port`` from the environment and check every option (the checkpoint's
    contents are the caller's to check: that needs the runtime's libraries)."""
    checkpoint = args.checkpoint or os.environ.get("MODEL_CHECKPOINT")
    if not checkpoint:
        raise ServeOptionError("serve needs a checkpoint: --checkpoint runs/NAME/best (or set MODEL_CHECKPOINT)")
    if not Path(checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    args.checkpoint = checkpoint
    if args.port is None:
        args.port = _env_port()
    if not 0 <= args.port <= 65535:
        raise ServeOptionError(f"port must be 0..65535, got {args.port}")
    if args.max_batch_tokens < 0:
        raise ServeOptionError(f"--max-batch-tokens must be >= 0 (0: no limit), got {args.max_batch_tokens}")
    for name in (
        "max_batch_size",
        "max_queue",
        "max_batch_texts",
        "max_text_chars",
        "max_body_bytes",
        "max_connections",
    ):
        if getattr(args, name) < 1:
            raise ServeOptionError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        raise ServeOptionError(f"--threads must be >= 0 (0: the runtime's default), got {args.threads}")
    if args.concurrent_passes < 0:
        raise ServeOptionError(
            f"--concurrent-passes must be >= 0 (0: one per usable core), got {args.concurrent_passes}"
        )
    for name in ("header_timeout", "body_timeout", "send_timeout", "forward_timeout"):
        if getattr(args, name) <= 0:
            raise ServeOptionError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    if args.max_pending_body_bytes < args.max_body_bytes:
        raise ServeOptionError(
            f"--max-pending-body-bytes ({args.max_pending_body_bytes}) "
            f"must be at least --max-body-bytes ({args.max_body_bytes})"
        )
    api_key_from_env()
    if args.max_wait_ms < 0:
        raise ServeOptionError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    try:
        tracing.check_endpoint(args.otlp_endpoint)
        if tracing.wanted(args.otlp_endpoint):
            tracing.require("serve --otlp-endpoint (or $OTEL_EXPORTER_OTLP_ENDPOINT)")
    except ConfigError as exc:
        raise ServeOptionError(str(exc)) from None
    _check_min_confidence(args.min_confidence, checkpoint)
    if args.onnx_model and not args.runtime.startswith("onnx"):
        raise ServeOptionError("--onnx-model needs --runtime onnx or onnx-int8")
    if args.runtime == "torch-bf16":
        _check_bf16()
    if args.onnx_model and not Path(args.onnx_model).is_file():
        raise FileNotFoundError(f"ONNX model {args.onnx_model} does not exist")


def _check_min_confidence(spec: str | None, checkpoint: str) -> None:
    """``--min-confidence`` well formed, and naming only labels the checkpoint has (where its files say which)."""
    from ..predict.confidence import ConfidenceThreshold
    from ..predict.predictor import checkpoint_labels

    try:
        threshold = ConfidenceThreshold.parse(spec)
        labels = checkpoint_labels(checkpoint) if threshold is not None else None
        if threshold is not None and labels:
            threshold.for_labels(labels)
    except ConfigError as exc:
        raise ServeOptionError(str(exc)) from None


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

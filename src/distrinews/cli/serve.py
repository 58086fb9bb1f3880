"""``distrinews serve``: the REST API under uvicorn.

``MODEL_CHECKPOINT`` and ``PORT`` stand in for ``--checkpoint`` and ``--port`` (as in the
reference system, and as container platforms set them). SIGTERM stops accepting connections, answers
every request already in flight, finishes the batcher's queue, then exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from ..config import ConfigError
from ..serve.predictor import DEFAULT_RUNTIME, RUNTIMES

DEFAULT_PORT = 7860
DEFAULT_MAX_BATCH_TOKENS = 0


def _env_port() -> int:
    raw = os.environ.get("PORT")
    if raw is None or raw == "":
        return DEFAULT_PORT
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"PORT={raw!r} is not a port number") from None
    return port


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a checkpoint over HTTP (REST API, demo page, metrics)")
    p.add_argument("--checkpoint", default=None, help="best/ directory, step-N directory or a legacy .pt file (default: $MODEL_CHECKPOINT)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=None, help=f"port (default: $PORT, else {DEFAULT_PORT})")
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=DEFAULT_RUNTIME,
        help=f"inference runtime (default: {DEFAULT_RUNTIME}; onnx-int8/onnx use CHECKPOINT/model.int8.onnx / model.onnx, made at "
        "start if missing; torch-bf16 only where the CPU or GPU computes bf16 in hardware)",
    )
    p.add_argument("--onnx-model", default=None, help="ONNX file for --runtime onnx or onnx-int8 (instead of the one beside CHECKPOINT)")
    p.add_argument("--max-batch-size", type=int, default=32, help="texts per forward pass")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=DEFAULT_MAX_BATCH_TOKENS,
        help="padded tokens per forward pass (the batch's longest text x its texts); 0: no limit",
    )
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="longest a batch waits for more requests")
    p.add_argument("--max-queue", type=int, default=1024, help="texts waiting before new requests get 429")
    p.add_argument("--max-batch-texts", type=int, default=64, help="texts allowed in one /predict/batch request (413 above)")
    p.add_argument("--max-text-chars", type=int, default=10_000, help="characters allowed in one text after stripping (422 above)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="request body cap in bytes (413 above)")
    p.add_argument("--timeout-graceful-shutdown", type=float, default=30.0, help="seconds SIGTERM waits for in-flight requests")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--no-access-log", action="store_true", help="do not log every request")
    p.set_defaults(func=cmd_serve)


def _validate(args: argparse.Namespace) -> None:
    checkpoint = args.checkpoint or os.environ.get("MODEL_CHECKPOINT")
    if not checkpoint:
        raise ConfigError("serve needs a checkpoint: --checkpoint runs/NAME/best (or set MODEL_CHECKPOINT)")
    from ..checkpoint import check_loadable

    check_loadable(checkpoint)  # a refused or damaged checkpoint: one line and exit 2, before the server starts
    args.checkpoint = checkpoint
    if args.port is None:
        args.port = _env_port()
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"port must be 0..65535, got {args.port}")
    if args.max_batch_tokens < 0:
        raise ConfigError(f"--max-batch-tokens must be >= 0 (0: no limit), got {args.max_batch_tokens}")
    for name in ("max_batch_size", "max_queue", "max_batch_texts", "max_text_chars", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    if args.onnx_model and not args.runtime.startswith("onnx"):
        raise ConfigError("--onnx-model needs --runtime onnx or onnx-int8")
    if args.runtime == "torch-bf16":
        import torch

        from ..serve.predictor import bf16_refusal

        if (why := bf16_refusal("cuda" if torch.cuda.is_available() else "cpu")) is not None:
            raise ConfigError(why)
    if args.onnx_model and not Path(args.onnx_model).is_file():
        raise FileNotFoundError(f"ONNX model {args.onnx_model} does not exist")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    from . import no_extra_arguments, require_extra

    no_extra_arguments("serve", extra)
    _validate(args)
    if args.runtime.startswith("onnx"):
        require_extra("onnxruntime", "onnx", f"serve --runtime {args.runtime}")
        require_extra("onnx", "onnx", f"serve --runtime {args.runtime}")
    import uvicorn

    from ..serve.app import ServeConfig, config_summary, create_app

    config = ServeConfig(
        checkpoint=args.checkpoint,
        runtime=args.runtime,
        onnx_model=args.onnx_model,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens or None,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_batch_texts=args.max_batch_texts,
        max_text_chars=args.max_text_chars,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(config)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("distrinews.serve").info("serving %s", config_summary(app.state.config))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=not args.no_access_log,
            timeout_graceful_shutdown=args.timeout_graceful_shutdown,
            lifespan="on",
        )
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal with the handler that was
    # in place before it started, so the process would die "killed by SIGTERM" after a clean
    # drain. With this handler in place, the re-raised signal is recorded and we exit 0:
    # a requested, completed shutdown is a success.
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: received.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return 1  # could not bind the port, or startup failed (uvicorn logged why)
    return 0

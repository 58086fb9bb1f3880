"""The server's command-line options, shared by ``distrinews serve`` and the slim ``python -m distrinews.serve``.

``MODEL_CHECKPOINT`` and ``PORT`` stand in for ``--checkpoint`` and ``--port`` (as in the
reference system, and as container platforms set them). Checks here import nothing heavy
(torch only to check that ``--runtime torch-bf16`` runs in hardware here).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .predictor import DEFAULT_RUNTIME, RUNTIMES

DEFAULT_PORT = 7860
DEFAULT_MAX_BATCH_TOKENS = 0  # no limit


class ServeOptionError(ValueError):
    """A server option is missing or out of range; the message says which and what to use."""


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    for name in ("max_batch_size", "max_queue", "max_batch_texts", "max_text_chars", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise ServeOptionError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_wait_ms < 0:
        raise ServeOptionError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
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
        raise ServeOptionError("--runtime torch-bf16 needs torch, which is not installed here; use --runtime onnx-int8 or onnx") from None
    from .predictor import bf16_refusal

    if (why := bf16_refusal("cuda" if torch.cuda.is_available() else "cpu")) is not None:
        raise ServeOptionError(why)

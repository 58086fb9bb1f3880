"""What every peer script shares: the model, loaded by the project's own code, and the request it answers.

``load`` builds the predictor ``distrinews serve`` builds by default (``runtime auto``: the checkpoint's int8 ONNX
model where it passed its check, kept in the cache, and the Rust tokenizer of its ``tokenizer.json``; else
PyTorch fp32), so a peer serves the same graph and the same token ids as ours, formats the same answer, and says
which model it runs in one ``PEER-MODEL {json}`` line of its log (the runner records it). ``text_of`` reads our
``POST /predict`` body, ``{"text": "..."}``, the load generator's request.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distrinews.predict.predictor import Predictor

MARKER = "PEER-MODEL "
HOST = "127.0.0.1"  # every peer binds loopback only
MAX_TEXT_CHARS = 10_000  # ours: serve/schemas.py PredictRequest


class BadRequest(ValueError):
    """A body that is not ``{"text": "<1 to MAX_TEXT_CHARS characters>"}``; each peer answers it with its 4xx."""


def text_of(payload: Any) -> str:
    """The text of our ``POST /predict`` body."""
    text = payload.get("text") if isinstance(payload, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise BadRequest('the body must be {"text": "<news text>"}')
    if len(text) > MAX_TEXT_CHARS:
        raise BadRequest(f"text is longer than {MAX_TEXT_CHARS} characters")
    return text


def load(checkpoint: str, peer: str, config: dict[str, Any]) -> Predictor:
    """Our default predictor on ``checkpoint``, warmed up, announced in one ``PEER-MODEL`` line."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from distrinews.predict.runtimes import auto_predictor

    predictor = auto_predictor(checkpoint)
    predictor.warmup()
    described = predictor.describe()
    model = {key: described.get(key) for key in ("runtime", "onnx_model", "onnx_quantized", "tokenizer")}
    print(MARKER + json.dumps({"peer": peer, "config": config, "model": model}), flush=True)
    return predictor


def classify(predictor: Predictor, texts: Sequence[str]) -> list[dict[str, Any]]:
    """Our answer for each text (``label``, ``label_id``, ``confidence``, ``probabilities``), in order."""
    return predictor.predict(list(texts))


def arguments(peer: str) -> argparse.Namespace:
    """A peer script's command line: the checkpoint, the port, and the batching it is configured with."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.tools.peers.serve_{peer}")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, required=True)
    parser.add_argument("--max-wait-ms", type=float, required=True)
    return parser.parse_args()

"""The reference server of ``distrinews bench serving``: the reference system's design (``../shared/seeds``), a
FastAPI app whose sync endpoint tokenizes one text (padded to ``max_length``) and runs one forward pass per
request, with no batching; ``reference_command`` starts it as ``python -m distrinews.bench.serving
--reference-server``, whose arguments ``serve_reference`` reads.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import BaseModel, Field

REFERENCE = "reference server (the reference system's: 1 request = 1 forward pass, padded to max_length, no batching)"


class PredictRequest(BaseModel):  # module level: FastAPI resolves the endpoint's annotation here
    text: str = Field(..., min_length=1, max_length=10000)


def reference_app(checkpoint: str):
    """The reference system's server: one tokenize + forward per request in FastAPI's thread pool."""
    from contextlib import asynccontextmanager

    import torch
    from fastapi import FastAPI, HTTPException

    from ..checkpoint.servable import load_for_inference

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app):
        state["model"], state["tokenizer"], state["info"] = load_for_inference(checkpoint)
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health():
        return {"status": "healthy", "model_loaded": "model" in state}

    @app.post("/predict")
    def predict(request: PredictRequest):
        if "model" not in state:
            raise HTTPException(status_code=503, detail="Model not loaded")
        model, tokenizer = state["model"], state["tokenizer"]
        enc = tokenizer(request.text, truncation=True, padding="max_length", max_length=state["info"].max_length, return_tensors="pt")
        with torch.no_grad():
            probs = torch.softmax(model(**enc).logits, dim=-1)[0]
        labels = [model.config.id2label[i] for i in range(len(probs))]
        label_id = int(probs.argmax())
        return {
            "label": labels[label_id],
            "label_id": label_id,
            "confidence": float(probs[label_id]),
            "probabilities": {name: float(p) for name, p in zip(labels, probs)},
        }

    return app


naive_app = reference_app  # the name earlier versions used


def serve_reference(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrinews.bench.serving --reference-server")
    parser.add_argument("--reference-server", "--naive-server", action="store_true")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(reference_app(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


def reference_command(checkpoint: str, port: int) -> list[str]:
    """The command that starts the reference server on ``port`` (what ``serve_reference`` reads)."""
    return [sys.executable, "-m", "distrinews.bench.serving", "--reference-server", "--checkpoint", checkpoint, "--port", str(port)]

"""Infinity (``infinity-emb``) serving our model: its own ASGI app (``infinity_emb.infinity_server.create_server``,
what its ``infinity_emb v2`` command runs) with one engine on the checkpoint, and our ``POST /predict`` added to
that app beside Infinity's ``/classify``: the same request and answer as ours, calling the engine as ``/classify``
does, so Infinity's own batching (its batch handler, up to ``batch_size``) forms the batches.

Infinity runs its ``torch`` engine on the checkpoint's fp32 weights, not our int8 ONNX graph: its ONNX engine
(``optimum``) cannot load a graph from a local folder beside torch 2.13. With optimum 2 (``optimum-onnx``), Infinity
0.0.78 hands ``ORTModelForSequenceClassification`` the graph's absolute path as its ``file_name``, which optimum
refuses ("Could not find any ONNX files with target file name /tmp/.../model_quantized.onnx, only found:
[model_quantized.onnx]"); optimum 1 fails to import ``optimum.onnxruntime`` on torch 2.13
(``torch.onnx.symbolic_opset14._attention_scale`` is gone). The tokenizer is ``transformers``' fast tokenizer of
the same ``tokenizer.json`` (the same Rust tokenizer, through its Python wrapper) inside a ``transformers``
text-classification pipeline.
"""

# No ``from __future__ import annotations``: FastAPI reads the /predict endpoint's annotation (a Request) as an
# object, and it is imported where the endpoint is defined.

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import serve_model

PEER = "infinity"
SERVED_NAME = "distrinews"


def config(max_batch_size: int, max_wait_ms: float) -> dict[str, Any]:
    """The configuration this script runs Infinity with (the benchmark's page shows it). Infinity batches what is
    queued when its engine is free, with no window to wait in: ``max_wait_ms`` does not apply."""
    return {
        "EngineArgs": {
            "engine": "torch",
            "device": "cpu",
            "batch_size": max_batch_size,
            "model_warmup": True,
            "bettertransformer": False,  # needs optimum.bettertransformer, which optimum 2 no longer has
        },
        "environment": {"DO_NOT_TRACK": "1"},
        "uvicorn": {"host": serve_model.HOST, "workers": 1},
    }


def model_folder(checkpoint: str, into: Path) -> None:
    """The checkpoint's files in a folder of their own (Infinity reads every file of the folder it is given)."""
    for path in Path(checkpoint).iterdir():
        if path.is_file() and not path.is_symlink() and not path.name.endswith(".onnx"):
            shutil.copyfile(path, into / path.name)


def our_answer(scores: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """Infinity's scores of one text (``[{"label", "score"}, ...]``) as our answer."""
    probabilities = {label: 0.0 for label in labels}
    probabilities.update({item["label"]: float(item["score"]) for item in scores})
    label = max(labels, key=probabilities.__getitem__)
    return {
        "label": label,
        "label_id": labels.index(label),
        "confidence": probabilities[label],
        "probabilities": probabilities,
    }


def main() -> None:
    args = serve_model.arguments(PEER)
    folder = Path(tempfile.mkdtemp(prefix="peer-infinity-"))
    try:
        serve(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve(args: Any, folder: Path) -> None:
    import json

    from distrinews.predict.predictor import checkpoint_labels

    model_folder(args.checkpoint, folder)
    settings = config(args.max_batch_size, args.max_wait_ms)
    os.environ.update(settings["environment"])
    import uvicorn
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from infinity_emb.args import EngineArgs
    from infinity_emb.infinity_server import create_server

    labels = checkpoint_labels(args.checkpoint) or []
    engine_args = EngineArgs(model_name_or_path=str(folder), served_model_name=SERVED_NAME, **settings["EngineArgs"])
    app = create_server(engine_args_list=[engine_args])

    @app.post("/predict")  # type: ignore[untyped-decorator]  # infinity_emb ships no types: its app is Any
    async def predict(request: Request) -> Any:
        try:
            text = serve_model.text_of(await request.json())
        except (ValueError, serve_model.BadRequest) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        scores, _ = await app.engine_array[SERVED_NAME].classify(sentences=[text], raw_scores=False)
        return our_answer(scores[0], labels)

    model = {"runtime": "infinity torch (fp32)", "weights": "the checkpoint's model.safetensors"}
    print(serve_model.MARKER + json.dumps({"peer": PEER, "config": settings, "model": model}), flush=True)
    uvicorn.run(app, port=args.port, log_level="warning", **settings["uvicorn"])


if __name__ == "__main__":
    main()

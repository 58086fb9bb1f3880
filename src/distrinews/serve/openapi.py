"""What /docs and /openapi.json say about the prediction routes: their bodies in every API shape, their answers,
their limits and status codes (``responses.declared``), and the response examples in the model's own labels. The
handlers are the app's; this module registers them with their declarations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from .options import ServeConfig
from .responses import declared
from .routes import PREDICT_BATCH_PATH, PREDICT_PATHS
from .schemas import (
    BatchPredictRequest,
    HfClassificationRequest,
    MultiLabelPredictResponse,
    Prediction,
    PredictRequest,
    PredictResponse,
    TeiPredictRequest,
    json_schema_body,
)


class _RequestRoute(APIRoute):
    """A route whose endpoint takes the ``Request`` and answers a ``Response`` itself (it reads its own body,
    ``limits``): called as it is, without FastAPI's per-request dependency solving and response handling."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request)
            return response

        return handler


def route_predict(app: FastAPI, config: ServeConfig, predict: Any) -> None:
    """POST /predict, / and /invocations: one handler, both API shapes and every error declared in /docs."""
    both_shapes = json_schema_body(PredictRequest, TeiPredictRequest, HfClassificationRequest)
    answers = PredictResponse | MultiLabelPredictResponse | list[Prediction] | list[list[Prediction]]
    codes = declared(400, 401, 413, 415, 422, 424, 429, 503, tei=True)
    described = (
        'One text in the seed\'s shape ({"text"}), or text-embeddings-inference\'s ({"inputs"}, with truncate, '
        'truncation_direction, raw_scores) or Hugging Face\'s ({"inputs", "parameters"}), answered in the same shape. '
        f"A batch in TEI's or Hugging Face's shape holds at most {config.max_batch_texts} texts."
    )
    shared: dict[str, Any] = {
        "response_model": answers,
        "description": described,
        "openapi_extra": both_shapes,
        "responses": codes,
        "route_class_override": _RequestRoute,
    }
    main, *others = PREDICT_PATHS
    app.router.add_api_route(
        main, predict, methods=["POST"], summary="classify a text (or a TEI or Hugging Face batch)", **shared
    )
    for path in others:  # where TEI serves a classifier too (InferenceClient(base_url=...) posts to /)
        summary, operation = f"the same as POST {main} (TEI's POST {path})", f"predict_at_{path.strip('/') or 'root'}"
        app.router.add_api_route(path, predict, methods=["POST"], summary=summary, operation_id=operation, **shared)


def route_predict_batch(app: FastAPI, config: ServeConfig, predict_batch: Any) -> None:
    """POST /predict/batch, its limit stated in /docs."""
    app.router.add_api_route(
        PREDICT_BATCH_PATH,
        predict_batch,
        methods=["POST"],
        response_model=list[PredictResponse | MultiLabelPredictResponse],
        summary=f"classify up to {config.max_batch_texts} texts, results in order",
        openapi_extra=json_schema_body(
            BatchPredictRequest,
            descriptions={"texts": f"1 to {config.max_batch_texts} texts (the server's --max-batch-texts)"},
        ),
        responses=declared(400, 401, 413, 415, 422, 429, 503),
        route_class_override=_RequestRoute,
    )


def label_examples(app: FastAPI, labels: list[str] | None) -> None:
    """The OpenAPI schema's response example in the model's labels (read from the checkpoint's files)."""
    if not labels:
        return
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()  # FastAPI's, cached on the app: the example is added once
        first, share = labels[0], round(1 / len(labels), 4)
        example = {"label": first, "label_id": 0, "confidence": share, "probabilities": dict.fromkeys(labels, share)}
        for name, shown in (("PredictResponse", example), ("Prediction", {"label": first, "score": share})):
            target = schema.get("components", {}).get("schemas", {}).get(name)
            if target is not None:
                target["examples"] = [shown]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

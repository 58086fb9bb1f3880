"""The API's request and response bodies: pydantic models (with the examples ``/docs`` shows) and
``ApiError``, the JSON error ``{"detail": "<what to fix>"}`` every failure is answered with."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr


class PredictRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"text": "Apple unveils a new iPhone with a faster chip"}]})
    text: StrictStr = Field(description="the news text to classify (1 to 10,000 characters after stripping)")


class BatchPredictRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"texts": ["Oil prices jump after OPEC cuts output", "Federer wins in straight sets"]}]}
    )
    texts: list[StrictStr] = Field(description="1 to 64 texts (the server's --max-batch-texts)")


class PredictResponse(BaseModel):
    label: str
    label_id: int
    confidence: float
    probabilities: dict[str, float]


class ApiError(Exception):
    """An error with an HTTP status and a message for the person who sent the request."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extra = status, detail, headers, extra


def error_response(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def json_schema_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI request body for routes that parse their own body (so /docs still shows it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}

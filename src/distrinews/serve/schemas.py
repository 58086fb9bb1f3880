"""The API's request and response bodies: pydantic models (with the examples ``/docs`` shows) and
``ApiError``, the JSON error ``{"detail": "<what to fix>"}`` every failure is answered with; and the
text-embeddings-inference and Hugging Face shapes ``/predict`` also takes (``tei`` reads them), for ``/docs``."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr


class PredictRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "Apple unveils a new iPhone with a faster chip"}]}
    )
    text: StrictStr = Field(description="the news text to classify (1 to 10,000 characters after stripping)")


class BatchPredictRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"texts": ["Oil prices jump after OPEC cuts output", "Federer wins in straight sets"]}]
        }
    )
    texts: list[StrictStr] = Field(description="the texts, at least one and at most the server's --max-batch-texts")


class PredictResponse(BaseModel):
    label: str = Field(description="the most probable label")
    label_id: int
    confidence: float = Field(description="the label's probability (after the checkpoint's temperature, if it has one)")
    probabilities: dict[str, float]
    confident: bool | None = Field(
        None,
        description="only when the server runs with --min-confidence: false when the confidence is below the label's "
        "threshold (the label is still the most probable one; the answer is one to check, not to act on)",
    )


class LabelScore(BaseModel):
    label: str
    label_id: int
    score: float = Field(description="the label's sigmoid score")


class MultiLabelPredictResponse(BaseModel):
    """A multi-label model's answer (its config's problem_type is multi_label_classification)."""

    labels: list[LabelScore] = Field(
        description="every label whose score reaches its threshold (tuned when training, stored in distrinews.json; "
        "--min-confidence replaces those it names), highest first; empty when none does"
    )
    probabilities: dict[str, float] = Field(description="every label's sigmoid score (they need not add up to 1)")


class TeiPredictRequest(BaseModel):
    """text-embeddings-inference's ``POST /predict`` body (its router's ``PredictRequest``)."""

    model_config = ConfigDict(
        title="TEI PredictRequest",
        json_schema_extra={
            "examples": [
                {"inputs": "Oil prices jump after OPEC cuts output"},
                {"inputs": [["Oil prices jump"], ["Federer wins"]]},
            ]
        },
    )
    inputs: str | list[str] | list[list[str]] = Field(
        description="one text, or a batch [[text], [text], ...]; a pair [a, b] (or [[a, b]] in a batch) is refused: "
        "this model classifies single texts"
    )
    truncate: bool | None = Field(
        None, description="cut a text longer than the model reads (null: yes); false: 422 instead"
    )
    truncation_direction: Literal["Left", "Right", "left", "right"] = Field("Right", description="which end is cut")
    raw_scores: bool = Field(False, description="log-probabilities instead of probabilities")


class HfParameters(BaseModel):
    top_k: int | None = Field(None, ge=1, description="only the k most probable labels (null: all)")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None,
        description="softmax (the default) or none (log-probabilities) for a single-label model; sigmoid (the "
        "default) or none (logits) for a multi-label one; the other function is refused",
    )


class HfClassificationRequest(BaseModel):
    """Hugging Face's inference API text-classification body (what ``InferenceClient.text_classification`` sends)."""

    model_config = ConfigDict(
        title="Hugging Face text-classification request",
        json_schema_extra={"examples": [{"inputs": "Federer wins in straight sets", "parameters": {"top_k": 2}}]},
    )
    inputs: str | list[str] = Field(description="one text, or several")
    parameters: HfParameters = Field(description="may be empty: {}")


class Prediction(BaseModel):
    """One label and its score, in TEI's and Hugging Face's answers (every label, highest score first)."""

    label: str
    score: float


class ErrorDetail(BaseModel):
    """Every error the seed's API answers: what to fix (a few add ``errors``, pydantic's list)."""

    detail: str


class TeiError(BaseModel):
    """text-embeddings-inference's error body, answered to requests in its or Hugging Face's shape."""

    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


# An error quotes at most this many characters of a value the client sent: enough to recognise it, never its
# megabytes echoed back in an answer the client need not read.
QUOTED_CHARS = 40


def kind_of(value: Any) -> str:
    """What a JSON value is, for an error that says what was expected: "an array", "a string" ..."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def quoted(value: Any) -> str:
    """A value a client sent, as every error message that quotes one shows it (both API shapes, every route): a
    string (or a number) as its ``repr``, cut to its first QUOTED_CHARS characters with its length said; an array or
    an object by its kind and size."""
    if isinstance(value, (list, dict)):
        return f"{kind_of(value)} of {len(value):,} {'items' if isinstance(value, list) else 'keys'}"
    text = value if isinstance(value, str) else str(value) if isinstance(value, (int, float)) else None
    if text is None or len(text) <= QUOTED_CHARS:
        return repr(value)
    return f"{text[:QUOTED_CHARS]!r}... ({len(text):,} characters)"


# What the public probes and the 503s say of a model that failed to load: which file and why is in the log only.
LOAD_FAILED = "the model failed to load (the server log says why)"


class ApiError(Exception):
    """An error with an HTTP status and a message for the person who sent the request."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extra = status, detail, headers, extra


def error_response(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def json_schema_body(*models: type[BaseModel], descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """OpenAPI request body for routes that parse their own body (so /docs still shows it): one model, or
    any of several. ``descriptions`` replace the fields' descriptions (a limit the server was started with)."""
    schemas = [_inlined(model.model_json_schema()) for model in models]
    for schema in schemas:
        for name, text in (descriptions or {}).items():
            if name in schema.get("properties", {}):
                schema["properties"][name]["description"] = text
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` put in place (one level: ours nest no deeper), for an inline body."""
    defs = schema.pop("$defs", {})
    for prop in schema.get("properties", {}).values():
        if (ref := prop.pop("$ref", None)) is not None:
            prop.update(defs[ref.rsplit("/", 1)[-1]])
    return schema

"""text-embeddings-inference's (TEI) and Hugging Face's inference API shapes, beside the seed's API.

A body with ``inputs`` (and no ``text``) on ``POST /predict``, ``/`` or ``/invocations`` is one of theirs: with
``parameters`` Hugging Face's text-classification request (``InferenceClient.text_classification``), else TEI's.
Both are answered as those servers answer, every label with its score, highest first: TEI a list for one text and a
list of those for a batch, Hugging Face a list per input (one text is ``[[...]]``). Their errors are TEI's
``{"error", "error_type"}`` with TEI's status codes; every answer carries TEI's timing headers, in whole ms.

Where this server answers otherwise than TEI, and why:

- a pair of texts (``["a", "b"]``, or ``[["a", "b"]]`` in a batch) is refused with 422: the model classifies
  single texts;
- ``raw_scores`` (and ``function_to_apply: "none"``) answers log-probabilities, the logits shifted by one constant
  per text (softmax cannot tell them apart); ``sigmoid`` is refused. A multi-label model is the other way round:
  ``sigmoid`` is accepted, ``softmax`` refused, and raw scores are its logits exactly (a sigmoid can be undone);
- ``truncation_direction: "left"`` cuts at a word boundary (``TextEncoder.encode_fitted``), so it may keep one
  partial word fewer than TEI;
- a batch over ``--max-batch-texts`` is 413 and an empty one 400 ``Empty``, as TEI's OpenAPI document declares (its
  router answers 422); a text of whitespace only is empty (400), as the seed API strips texts;
- a body that is not a JSON object cannot be told apart, so it gets the seed API's error; so do the 401 and 413 the
  middlewares answer before the body is read.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from ..predict.tokens import TextTooLong
from .limits import clean_text
from .schemas import ApiError, kind_of, quoted

TRUNCATION_DIRECTIONS = ("Left", "left", "Right", "right")
HF_PARAMETERS = ("top_k", "function_to_apply")
# TEI's ErrorType for each status it answers (its router's ``From<&ErrorType> for StatusCode``, read backwards);
# any other 4xx is a Validation error, any other 5xx a Backend one.
ERROR_TYPES = {400: "Empty", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}
# log(p) of a probability that underflowed to 0: the log of the smallest float64, as JSON has no -Infinity.
LOG_OF_ZERO = math.log(5e-324)
PAIRS_REFUSED = (
    "text pairs are not supported: this model classifies single texts (TEI reads [a, b] as one pair of texts); "
    'send one text as "a" or ["a"], a batch as [["a"], ["b"]]'
)


@dataclass(frozen=True)
class ForeignRequest:
    """A TEI or Hugging Face request, read and checked."""

    texts: list[str]
    batch: bool  # TEI's answer for a batch is a list per text (Hugging Face's always is)
    log_scores: bool  # raw scores: log-probabilities, or a multi-label model's logits
    truncate: bool  # False: a text longer than the model reads is refused (422)
    keep_end: bool  # truncate on the left
    multi_label: bool = False  # the model's scores are a sigmoid per label


def is_foreign(payload: Any) -> bool:
    """Whether a JSON body is in TEI's or Hugging Face's shape (``text`` is the seed's: it wins)."""
    return isinstance(payload, dict) and "inputs" in payload and "text" not in payload


def _invalid(message: str, status: int = 422) -> ApiError:
    return ApiError(status, f"Input validation error: {message}")  # TEI's prefix for what a request got wrong


def _text(value: Any, where: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{where} must be a string, got {kind_of(value)}")
    if not value.strip():
        raise _invalid(f"{where} cannot be empty", 400)
    return clean_text(value, where, max_chars)


def _inputs(inputs: Any, max_texts: int, max_chars: int, hf: bool) -> tuple[list[str], bool]:
    """The texts, and whether they are a batch. Hugging Face's ``inputs``: a string, or a list of strings (a batch).
    TEI's ``PredictInput``: a string, ``[text]``, ``[a, b]`` (a pair), or a batch ``[[text], ...]``."""
    if isinstance(inputs, str):
        return [_text(inputs, "`inputs`", max_chars)], hf
    if not isinstance(inputs, list):
        shapes = "a list of strings" if hf else 'a batch [["a"], ["b"]]'
        raise _invalid(f"`inputs` must be a string or {shapes}, got {kind_of(inputs)}")
    if not inputs:
        raise _invalid("`inputs` cannot be empty", 400)
    if not hf and not isinstance(inputs[0], list):  # not a batch: [text] or a pair
        if len(inputs) == 1:
            return [_text(inputs[0], "`inputs[0]`", max_chars)], False
        if len(inputs) == 2:
            raise ApiError(422, PAIRS_REFUSED)
        raise _invalid(f'`inputs` has {len(inputs)} strings; send "a", ["a"] or a batch [["a"], ["b"]]')
    if len(inputs) > max_texts:
        raise ApiError(413, f"batch size {len(inputs)} > maximum allowed batch size {max_texts}")
    if hf:
        return [_text(text, f"`inputs[{i}]`", max_chars) for i, text in enumerate(inputs)], True
    texts = []
    for i, item in enumerate(inputs):
        if not isinstance(item, list):
            raise _invalid(f'`inputs[{i}]` must be ["text"] in a batch, got {kind_of(item)}')
        if len(item) == 2:
            raise ApiError(422, f"`inputs[{i}]`: {PAIRS_REFUSED}")
        if len(item) != 1:
            raise _invalid(f'`inputs[{i}]` has {len(item)} strings; a batch item is ["text"]')
        texts.append(_text(item[0], f"`inputs[{i}][0]`", max_chars))
    return texts, True


def _hf_parameters(parameters: Any, multi_label: bool = False) -> tuple[int | None, str | None]:
    if parameters is None:
        return None, None
    if not isinstance(parameters, dict):
        raise _invalid(f"`parameters` must be an object, got {kind_of(parameters)}")
    if (name := next((name for name in parameters if name not in HF_PARAMETERS), None)) is not None:
        raise _invalid(f"`parameters` has {quoted(name)}, which is not one of {', '.join(HF_PARAMETERS)}")
    top_k, function = parameters.get("top_k"), parameters.get("function_to_apply")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise _invalid(f"`parameters.top_k` must be a whole number >= 1, got {quoted(top_k)}")
    own, other = ("sigmoid", "softmax") if multi_label else ("softmax", "sigmoid")
    if function == other:
        kinds = {"sigmoid": "multi-label models", "softmax": "single-label models"}
        why = f'"{other}" is for {kinds[other]}; this one is {"multi" if multi_label else "single"}-label ({own})'
        raise _invalid(f"`parameters.function_to_apply` {why}")
    if function not in (None, own, "none"):
        raise _invalid(f'`parameters.function_to_apply` must be "{own}" or "none", got {quoted(function)}')
    return top_k, function


def parse(
    payload: dict[str, Any], max_texts: int, max_chars: int, multi_label: bool = False
) -> tuple[ForeignRequest, int | None]:
    """The request and Hugging Face's ``top_k`` (None: every label); every way it can be wrong is an ApiError.
    ``multi_label``: the model's scores are a sigmoid per label (which ``function_to_apply`` it takes)."""
    raw_scores = payload.get("raw_scores", False)
    if not isinstance(raw_scores, bool):
        raise _invalid(f"`raw_scores` must be true or false, got {kind_of(raw_scores)}")
    truncate = payload.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise _invalid(f"`truncate` must be true, false or null, got {kind_of(truncate)}")
    direction = payload.get("truncation_direction", "Right")
    if direction not in TRUNCATION_DIRECTIONS:
        raise _invalid(f'`truncation_direction` must be "Left" or "Right", got {quoted(direction)}')
    hf = "parameters" in payload
    top_k, function = _hf_parameters(payload["parameters"], multi_label) if hf else (None, None)
    texts, batch = _inputs(payload["inputs"], max_texts, max_chars, hf)
    log_scores = (function == "none") if function is not None else raw_scores
    # truncate null: TEI's --auto-truncate, whose default is true
    request = ForeignRequest(texts, batch, log_scores, truncate is not False, direction.lower() == "left", multi_label)
    return request, top_k


def encoding(request: ForeignRequest, encoder: Any) -> Callable[[list[str]], Any] | None:
    """How the request's texts are tokenized (None: as every request's) with the predictor's ``encoder``: refused if
    one is too long and ``truncate`` is false, cut at the start for left truncation."""
    if request.truncate and not request.keep_end:
        return None
    if encoder is None:
        raise _invalid("this server's predictor cannot measure texts: send truncate true, direction right")
    return functools.partial(encoder.encode_fitted, truncate=request.truncate, keep_end=request.keep_end)


def too_long(exc: TextTooLong) -> ApiError:
    """TEI's words for a text longer than the model reads, with ``truncate: false``."""
    return _invalid(f"`inputs` must have less than {exc.max_length} tokens. Given: {exc.tokens}")


def _score(p: float, log: bool, multi_label: bool = False) -> float:
    if not log:
        return p
    if multi_label:  # the logit the sigmoid came from: log p - log(1 - p)
        return (math.log(p) if p > 0 else LOG_OF_ZERO) - (math.log1p(-p) if p < 1 else LOG_OF_ZERO)
    return math.log(p) if p > 0 else LOG_OF_ZERO


def answer(request: ForeignRequest, results: list[dict[str, Any]], top_k: int | None = None) -> list[Any]:
    """TEI's (or Hugging Face's) answer from the predictor's results: every label (or the ``top_k``), highest first."""
    ranked, log, multi_label = [], request.log_scores, request.multi_label
    for result in results:  # sorted() is stable: equal scores keep the model's label order
        highest_first = sorted(result["probabilities"].items(), key=lambda item: -item[1])[:top_k]
        ranked.append([{"label": label, "score": _score(p, log, multi_label)} for label, p in highest_first])
    return ranked if request.batch else ranked[0]


def error_response(exc: ApiError) -> JSONResponse:
    """TEI's error body for an ApiError: ``{"error", "error_type"}``, the same status and headers (Retry-After)."""
    error_type = ERROR_TYPES.get(exc.status, "Validation" if exc.status < 500 else "Backend")
    return JSONResponse({"error": exc.detail, "error_type": error_type}, status_code=exc.status, headers=exc.headers)


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))  # whole milliseconds, rounded down: TEI's Duration::as_millis


def timing_headers(start: float, timing: dict[str, float], characters: int, runtime: str) -> dict[str, str]:
    """TEI's per-answer headers: ``start`` is the route's ``time.perf_counter()``, ``timing`` the batcher's."""
    total = _ms(time.perf_counter() - start)
    return {
        "x-compute-type": runtime,
        "x-compute-time": total,
        "x-compute-characters": str(characters),
        "x-compute-tokens": str(int(timing.get("tokens", 0))),
        "x-total-time": total,
        "x-tokenization-time": _ms(timing.get("tokenize_s", 0.0)),
        "x-queue-time": _ms(timing.get("queue_s", 0.0)),
        "x-inference-time": _ms(timing.get("inference_s", 0.0)),
    }

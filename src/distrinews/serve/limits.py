"""Reading a request body within bounds: JSON only, UTF-8, nested at most ``MAX_JSON_DEPTH`` deep,
numbers at most ``MAX_NUMBER_CHARS`` long, then validated against its schema; and each text: its length,
and text a model takes (``data.text``: no lone surrogate, no NUL). Every way a body can be wrong is a 4xx
``ApiError`` that says how, never a 500.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..data.text import text_fault
from .schemas import ApiError, quoted

Body = TypeVar("Body", bound=BaseModel)

# Request bodies: JSON arrays/objects nest at most this deep (ours need 2), and a number may
# have at most this many characters (ours have none; Python's int() refuses 4,300+ digits).
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 100


@dataclass(frozen=True)
class _LongNumber:
    """Stands in for a JSON number spelled with more than MAX_NUMBER_CHARS characters (never converted)."""

    chars: int


_TOO_DEEP = f"request body is nested too deeply: JSON arrays and objects may nest at most {MAX_JSON_DEPTH} levels"


def _too_deep(payload: Any) -> bool:
    """Whether arrays/objects nest deeper than MAX_JSON_DEPTH: one level at a time, no recursion."""
    level = [payload] if isinstance(payload, (dict, list)) else []
    for _ in range(MAX_JSON_DEPTH):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


def _find_long_number(value: Any, path: tuple[str, ...] = ()) -> tuple[str, _LongNumber] | None:
    """Where the first over-long number is, as ``texts.1`` (recursion is bounded: depth was checked)."""
    for key, child in value.items() if isinstance(value, dict) else enumerate(value):
        if isinstance(child, _LongNumber):
            return ".".join((*path, str(key))), child
        if isinstance(child, (dict, list)) and (found := _find_long_number(child, (*path, str(key)))):
            return found
    return None


def parse_json(text: str) -> Any:
    """``json.loads`` with bounded work; every failure is a 422 ApiError.

    Nesting: the C decoder's recursion guard stops 4 MB of ``[`` in well under a millisecond; what parses is then
    checked level by level (a character pre-scan in Python measured up to 40x slower than the parse). Numbers longer
    than MAX_NUMBER_CHARS are never converted (int() would do quadratic work first); the error names where they are.
    """
    long_numbers: list[_LongNumber] = []

    def number(convert: Callable[[str], Any]) -> Callable[[str], Any]:
        def parse(literal: str) -> Any:
            if len(literal) <= MAX_NUMBER_CHARS:
                return convert(literal)
            long_numbers.append(_LongNumber(len(literal)))
            return long_numbers[-1]

        return parse

    try:
        payload = json.loads(text, parse_int=number(int), parse_float=number(float))
    except RecursionError:
        raise ApiError(422, _TOO_DEEP) from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise ApiError(422, f"request body is not valid JSON: {exc.msg} at {where}") from None
    # Text with at most MAX_JSON_DEPTH brackets in all cannot nest deeper: skip the walk (C-speed count).
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(payload):
        raise ApiError(422, _TOO_DEEP)
    if long_numbers:
        found = _find_long_number(payload) if isinstance(payload, (dict, list)) else None
        where, long_number = found or ("body", long_numbers[0])
        why = f"a number of {long_number.chars:,} characters is too long; numbers may have at most {MAX_NUMBER_CHARS}"
        raise ApiError(422, f"{where}: {why} (send text as a JSON string)")
    return payload


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as ``model``; every way it can be wrong is a 4xx that says how."""
    return validate_body(await read_object(request, model), model)


async def read_object(request: Request, model: type[BaseModel]) -> dict[str, Any]:
    """The request's body as a JSON object, not yet validated (``model`` gives the example an empty body is told)."""
    content_type = request.headers.get("content-type") or ""
    media = content_type.split(";", 1)[0].strip()
    kind = media.lower()  # application/json (any parameters, any case) or an application/*+json type
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        got = f"Content-Type {quoted(media)}" if content_type.strip() else "no Content-Type"
        send = "send the body as JSON with the header 'Content-Type: application/json'"
        raise ApiError(415, f"unsupported media type: got {got}; {send}")
    raw = await request.body()
    if not raw.strip():
        extra = model.model_config.get("json_schema_extra")
        examples = extra.get("examples") if isinstance(extra, dict) else None
        example = json.dumps(examples[0] if isinstance(examples, list) and examples else {})
        raise ApiError(422, "request body is empty: send a JSON object, e.g. " + example)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(422, f"request body is not valid UTF-8 (byte {exc.start}): send JSON encoded as UTF-8") from None
    payload = parse_json(text)
    if not isinstance(payload, dict):
        raise ApiError(422, f"request body must be a JSON object, got {type(payload).__name__}")
    return payload


def validate_body(payload: dict[str, Any], model: type[Body]) -> Body:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:  # one sentence: ``texts.2: Input should be a valid string``; and pydantic's list
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        said = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body') or 'body'}: {e['msg']}" for e in errors]
        raise ApiError(422, "invalid request body: " + "; ".join(said), errors=errors) from None


def clean_text(text: str, where: str, max_chars: int) -> str:
    stripped = text.strip()
    if not stripped:
        raise ApiError(422, f"{where} is empty (or only whitespace): send 1 to {max_chars:,} characters of text")
    if len(stripped) > max_chars:
        raise ApiError(422, f"{where} has {len(stripped):,} characters; the limit is {max_chars:,}")
    if (fault := text_fault(stripped)) is not None:  # JSON may smuggle in a lone surrogate ("\ud800") or a NUL
        raise ApiError(422, f"{where} {fault}")
    return stripped

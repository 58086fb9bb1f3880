"""How a config field is declared and read: ``option``, the parsing of command-line strings by the field's type,
and pydantic's complaints turned into one line that names the field."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo

from ..errors import ConfigError


def option(
    default: Any, help: str, *, aliases: tuple[str, ...] = (), hints: tuple[str, ...] = (), **checks: Any
) -> Any:
    """A field's one declaration: default, help text, pydantic's checks (``ge``, ``lt``, ...), the other
    names it is accepted under (``aliases``: the original system's flags) and words a user may mean it by
    (``hints``: offered as "did you mean" for an unknown name)."""
    extra: dict[str, Any] = {"aliases": list(aliases), "hints": list(hints)}
    return Field(default, description=help, json_schema_extra=extra, **checks)


def declared_names(info: FieldInfo, kind: str) -> list[str]:
    """The ``aliases`` or ``hints`` that ``option`` declared for a field."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return [str(name) for name in typing.cast(list[Any], extra.get(kind, []))]


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NULL = {"null", "none", "~", ""}


def value_from_text(annotation: Any, value: Any) -> Any:
    """``value`` as a field of type ``annotation`` takes it: command-line strings are parsed by the type; null,
    none or ~ is None for an optional field, auto is None for an optional switch (decided at run time)."""
    base = _base(annotation)
    optional = base is not annotation
    if isinstance(value, str):
        text = value.strip().lower()
        if optional and (text in _NULL or (base is bool and text == "auto")):
            return None
        if base is bool and text in _TRUE | _FALSE:
            return text in _TRUE
        if base is int and re.fullmatch(r"[+-]?\d[\d_]*", text):
            return int(text.replace("_", ""))
    if base is str and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # a YAML list of names
    if typing.get_origin(base) is list and isinstance(value, str):  # a list, comma-separated on the command line
        return [item.strip() for item in value.split(",") if item.strip()]
    if (base in (int, float) and isinstance(value, bool)) or (
        base is bool and isinstance(value, (int, float)) and not isinstance(value, bool)
    ):
        raise ValueError(f"expects {base.__name__}")
    return value


def type_words(annotation: Any) -> str:
    base = _base(annotation)
    words = (
        " | ".join(map(str, typing.get_args(base)))
        if typing.get_origin(base) is Literal
        else getattr(base, "__name__", str(base))
    )
    return f"{words} or null" if base is not annotation else words


def config_error(exc: ValidationError, declaration: Callable[[str], FieldInfo | None]) -> ConfigError:
    """pydantic's first complaint as one line that names the field (and what the value must be)."""
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    name = next((str(part) for part in reversed(err["loc"]) if isinstance(part, str)), "?")
    value, kind, msg = err.get("input"), err["type"], err["msg"].removeprefix("Value error, ")
    info = declaration(name)
    annotation = info.annotation if info is not None else None
    base, field = _base(annotation), f"config field '{name}'"
    if value is None and kind.endswith(("_type", "_parsing")):
        return ConfigError(f"{field} may not be null")
    if kind == "value_error" and msg.startswith("expects "):
        return ConfigError(f"{field} {msg}, got {value!r}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and info is not None:
        msg = f"must be {_bounds(info)}"
    elif kind == "literal_error":
        allowed = typing.get_args(typing.get_args(base)[0] if typing.get_origin(base) is list else base)
        msg = f"must be one of {', '.join(map(str, allowed))}"
    elif kind == "finite_number":
        msg = "must be a finite number"
    elif kind == "string_too_short":
        msg = "must not be empty"
    elif kind != "value_error":
        return ConfigError(f"{field} expects {getattr(base, '__name__', str(annotation))}, got {value!r}")
    return ConfigError(f"{field}: {msg} (got {value!r})")


def _base(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _bounds(info: FieldInfo) -> str:
    b = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None}
    low = ("[", b["ge"]) if "ge" in b else ("(", b["gt"]) if "gt" in b else None
    high = ("]", b["le"]) if "le" in b else (")", b["lt"]) if "lt" in b else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return next((f"{signs[k]} {v}" for k, v in b.items()), "in range")

"""Which fields of a corpus row are its text, its id and its label, and why a row has none to give (:class:`BadRow`,
whose message is the rejects file's reason).

The text is ``text_field`` (default ``text``; without one, AG News's ``title`` and ``description`` joined as in
training). The id is ``id_field`` when one is named, else the row number. The label (for evaluation) is a class name
(any case) or a 0-based id; a multi-label model's a list of them, or a 0/1 column per label, as training reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .rows import clean_text
from .text import text_fault

DEFAULT_TEXT_FIELD = "text"
# The characters of a corpus row's text that are tokenized: the server's limit on a text. The model reads its first
# max_length tokens (128 by default), which come from far fewer characters, so the cut only spares the tokenizer
# a long text's tail.
TEXT_CHARS = 10_000
AG_NEWS_FIELDS = ("title", "description")


class BadRow(ValueError):
    """A row that cannot be used; the message says why (the rejects file's ``reason``)."""


@dataclass(frozen=True)
class RowFields:
    text_field: str = DEFAULT_TEXT_FIELD
    id_field: str | None = None
    label_field: str | None = None

    def columns(self) -> list[str]:
        """The fields a reader needs to read (Parquet reads only these)."""
        ag_news = AG_NEWS_FIELDS if self.text_field == DEFAULT_TEXT_FIELD else ()
        return [self.text_field, *ag_news, *([self.id_field] if self.id_field else []), *self.label_columns()]

    def label_columns(self) -> list[str]:
        """The label field, or a multi-label set's 0/1 columns, one per label (their names, comma-separated)."""
        return [name.strip() for name in (self.label_field or "").split(",") if name.strip()]

    def text(self, fields: dict[str, Any]) -> str:
        if self.text_field in fields:
            text = _string(fields, self.text_field)
        elif self.text_field == DEFAULT_TEXT_FIELD and all(name in fields for name in AG_NEWS_FIELDS):
            text = clean_text(*(_string(fields, name, null_ok=True) for name in AG_NEWS_FIELDS))
        else:
            also = f" (nor {' and '.join(map(repr, AG_NEWS_FIELDS))})" if self.text_field == DEFAULT_TEXT_FIELD else ""
            raise BadRow(f"no field {self.text_field!r}{also}")
        own = self.text_field in fields
        if not text.strip():
            raise BadRow(f"empty text in {self.text_field!r}" if own else "empty text (title and description)")
        if (fault := text_fault(text)) is not None:
            raise BadRow(f"text {self.text_field!r} {fault}" if own else f"text (title and description) {fault}")
        return text

    def id(self, fields: dict[str, Any], row_number: int) -> Any:
        if self.id_field is None:
            return row_number
        if self.id_field not in fields:
            raise BadRow(f"no id field {self.id_field!r}")
        value = fields[self.id_field]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise BadRow(f"empty id in {self.id_field!r}")
        if isinstance(value, str):
            if (fault := text_fault(value)) is not None:
                raise BadRow(f"id {self.id_field!r} {fault}")
            return value
        # what every output format writes as it is: JSON has no NaN, a bool or bytes is no id
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRow(f"id {self.id_field!r} is {value!r}, not a finite number")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise BadRow(f"id {self.id_field!r} is {_a(value)}, not a string or number")

    def label(self, fields: dict[str, Any], names: Sequence[str]) -> int:
        """The row's class as a 0-based id into ``names``."""
        (column,) = self.label_columns()
        if column not in fields:
            raise BadRow(f"no label field {column!r}")
        return parse_label(fields[column], names)

    def labels(self, fields: dict[str, Any], names: Sequence[str]) -> list[int]:
        """A multi-label row's labels as a 0/1 per name of ``names``, in a form the training reader takes: the label
        field's list (``label_keys``), each label a name (any case) or a 0-based id, or a 0/1 column per label
        (``label_flag``), each named by its label (any case)."""
        columns = self.label_columns()
        if (missing := next((name for name in columns if name not in fields), None)) is not None:
            raise BadRow(f"no label field {missing!r}")
        hot = [0] * len(names)
        if len(columns) > 1:
            lowered = [name.lower() for name in names]
            for column in columns:
                hot[lowered.index(column.lower())] = int(label_flag(fields[column], column))
            return hot
        for key in label_keys(fields[columns[0]], columns[0]):
            hot[parse_label(key, names)] = 1
        return hot


def parse_label(value: Any, names: Sequence[str]) -> int:
    """A class name (any case) or a 0-based id (``2``, ``"2"``) as an id into ``names``."""
    if isinstance(value, bool) or value is None:
        raise BadRow(f"label {value!r} is not a class name or id")
    text = str(value).strip()
    lowered = [name.lower() for name in names]
    if text.lower() in lowered:
        return lowered.index(text.lower())
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
        return int(text)
    raise BadRow(f"label {value!r} is none of {', '.join(names)} (or an id 0-{len(names) - 1})")


def _string(fields: dict[str, Any], name: str, null_ok: bool = False) -> str:
    value = fields[name]
    if value is None and null_ok:
        return ""
    if not isinstance(value, str):
        raise BadRow(f"field {name!r} is {'null' if value is None else _a(value)}, not text")
    return value


def _a(value: Any) -> str:
    """``a list``, ``an int``: the type of ``value`` in words."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def label_keys(value: Any, column: str) -> tuple[str, ...]:
    """A multi-label row's labels, as the training reader takes them (``labelled.py``): a list (JSONL, Parquet), or
    text holding a JSON list or comma-separated names; an empty list is a row with none of the labels."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise BadRow(f"{column!r} holds {clip(text)}, which is not a JSON list") from None
        else:
            value = [part for part in text.split(",") if part.strip()]
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):  # a numpy array (Parquet, datasets)
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise BadRow(
            f"{column!r} holds {clip(repr(value))}; a multi-label row's label is a list of labels "
            "(or, in CSV, names separated by commas)"
        )
    return tuple(dict.fromkeys(label_key(item, column) for item in value))


def label_flag(value: Any, column: str) -> bool:
    """A 0/1 label column's value: 0 or 1 (a number, a bool, or their text)."""
    text = str(value).strip().lower() if value is not None else ""
    if text in ("1", "1.0", "true"):
        return True
    if text in ("0", "0.0", "false"):
        return False
    raise BadRow(f"label column {column!r} holds {clip(repr(value))}, not 0 or 1")


def label_key(value: Any, column: str) -> str:
    """One raw label as the training reader takes it: a string or an integer (an integral float too), stripped."""
    if isinstance(value, (bool, list, dict)) or (isinstance(value, float) and not value.is_integer()):
        raise BadRow(f"label {value!r} in {column!r} is not a string or an integer")
    if isinstance(value, float):
        value = int(value)
    text = "" if value is None else str(value).strip()
    if not text:
        raise BadRow(f"empty label in {column!r}")
    return text


def clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""A split of AG News as rows of (text, class), and the one way their text is cleaned, whatever the source."""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

DATA_ENV = "DISTRINEWS_DATA"
HUB_DATASET = "fancyzhx/ag_news"
AG_NEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")  # classes 1-4 of the release, in order
Split = TypeVar("Split", bound="RawSplit")


@dataclass
class RawSplit:
    texts: list[str]
    labels: list[Any]  # 0-based class ids; multi-label: a 0/1 list per row, one entry per label (multi-hot)
    source: str
    where: list[str] | None = None  # each row's file:line (or data set and row), for messages that name a row

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def multi_label(self) -> bool:
        return bool(self.labels) and isinstance(self.labels[0], list)

    @property
    def strata(self) -> list[Hashable]:
        """What a stratified sample keeps in proportion: the class, or for multi-label the row's set of labels."""
        return [tuple(y) for y in self.labels] if self.multi_label else list(self.labels)

    def subset(self: Split, indices: Sequence[int]) -> Split:
        where = [self.where[i] for i in indices] if self.where is not None else None
        texts, labels = [self.texts[i] for i in indices], [self.labels[i] for i in indices]
        return replace(self, texts=texts, labels=labels, where=where)


_ESCAPED_DOLLAR = re.compile(r"\\\$")
_BACKSLASH_BREAK = re.compile(r"\\+n?(?=[A-Z\s\"']|$)|\\+")


def clean_text(title: str, description: str) -> str:
    """Title + " " + description, with the release's escapes undone: a line break written as a backslash
    (``dwindling\\band``) or a literal ``\\n``, ``\\$`` for a dollar sign, ``#39;`` and ``quot;`` for HTML entities."""
    text = f"{title} {description}"
    if "\\" in text:  # most rows have no escape: the two searches are most of the time spent reading a split
        text = _ESCAPED_DOLLAR.sub("$", text)
        text = _BACKSLASH_BREAK.sub(" ", text)
    text = (
        text.replace(" #39;", "'")
        .replace("#39;", "'")
        .replace(" quot;", ' "')
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
    )
    return " ".join(text.split())  # runs of whitespace (str.isspace, as re's \s) made one space, ends stripped


# Both ways to get the data, for every message that has to say none was found.
GET_DATA = (
    f"get AG News either way: pass --data DIR (or set ${DATA_ENV}) to a directory holding train.csv[.gz] and "
    "test.csv[.gz] in the original layout (class 1-4, title, description; no header), or run where the Hugging Face "
    f"hub is reachable, which downloads {HUB_DATASET} once and caches it (needs `pip install 'distrinews[hub]'`)"
)

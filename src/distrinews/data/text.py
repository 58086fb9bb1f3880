"""Which strings a model may be given as text: the one check the server (a 422) and the corpus readers (a rejected
row) make. A lone surrogate from JSON (``"\\ud800"``) is not Unicode text: the tokenizer refuses it and no UTF-8
file can hold it. A NUL is what a file's damaged or unwritten blocks read as, never a headline; the tokenizer drops
it silently, and many consumers of the results (C strings, PostgreSQL ``text``) cannot hold it in an id.
"""

from __future__ import annotations

NUL = "\x00"


def text_fault(text: str) -> str | None:
    """Why ``text`` is not text a model takes (the words follow its name: ``"'text' contains ..."``), else None."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains an unpaired surrogate (character {exc.start}): not valid Unicode text"
    position = text.find(NUL)
    if position >= 0:
        return f"contains a NUL character (character {position}): binary data, not text"
    return None

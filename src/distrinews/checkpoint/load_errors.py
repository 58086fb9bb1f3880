"""Reading a checkpoint that is damaged, incomplete or refused: one :class:`CheckpointError` line naming the file and
why, whichever of torch, safetensors, transformers and json failed in its own words.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from ..errors import CheckpointError


def first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours its hints
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from (or while handling), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _why(exc: BaseException) -> str:
    """What went wrong, in words a person can act on, without torch's advice to unpickle anyway."""
    if isinstance(exc, pickle.UnpicklingError) and "weights only load failed" in str(exc).lower():
        blocked = re.search(r"GLOBAL ([\w.]+)", str(exc))
        return (
            "the file contains pickled code that is not allowed "
            f"({f'{blocked.group(1)}; ' if blocked else ''}refused, not loaded)"
        )
    if isinstance(exc, SafetensorError):
        return f"the safetensors file is invalid or truncated ({first_line(exc)})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, (pickle.UnpicklingError, EOFError)) or (
        isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc)
    ):
        return f"not a readable PyTorch checkpoint file ({first_line(exc)})"
    message = first_line(exc)
    if "weights_only" in message:
        return f"{type(exc).__name__} (refused; not loaded)"
    if isinstance(exc, FileNotFoundError):
        return f"missing file {exc.filename or message}"
    if isinstance(exc, KeyError):
        return f"missing key {message}"
    return f"{type(exc).__name__}: {message}"


# What reading a damaged, incomplete or refused checkpoint raises (torch, safetensors, transformers, json).
_LOAD_ERRORS = (pickle.UnpicklingError, SafetensorError, OSError, EOFError, ValueError, KeyError, RuntimeError)


@contextmanager
def loading(where: Path, also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn a failure to read ``where`` into one-line :class:`CheckpointError` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except _LOAD_ERRORS + also as exc:
        raise CheckpointError(f"could not load checkpoint {where}: {_why(exc)}") from exc

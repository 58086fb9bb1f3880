"""Whether a Hugging Face model folder holds its own tokenizer, told from its file names (no torch, no transformers).

Without the tokenizer's files ``AutoTokenizer.from_pretrained`` does not fail: it builds one with an empty
vocabulary, which maps every word to ``[UNK]``, and the model gives nearly the same answer for every text. So the
files are looked for before anything is loaded. The slim ONNX server imports this module too, hence no torch here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError
from .records import describe, read_servable_info

# Any one of these holds a vocabulary: a fast tokenizer, WordPiece, BPE, SentencePiece.
VOCABULARY_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
# What save_pretrained writes for the BERT-style tokenizers trained here (the names the message gives).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def has_tokenizer(directory: str | os.PathLike[str]) -> bool:
    directory = Path(directory)
    return any((directory / name).is_file() for name in VOCABULARY_FILES)


def needs_own_tokenizer(directory: str | os.PathLike[str]) -> bool:
    """A Hugging Face model folder, which must carry its tokenizer. Not a resumable ``step-N``: it carries its
    tokenizer in its ``records.STEP_MODEL`` folder (checked when it loads); nor the seed's ``.pt``, which holds none."""
    found = describe(directory)
    return found is not None and found.kind == "pretrained"


def require_tokenizer(directory: str | os.PathLike[str], base_model: str | None = None) -> None:
    """Raise :class:`CheckpointError` naming the missing files and how to put them back when ``directory`` holds no
    vocabulary. ``base_model``: where its tokenizer loads from (default: ``distrinews.json``'s ``model_name``)."""
    directory = Path(directory)
    if has_tokenizer(directory):
        return
    missing = [name for name in TOKENIZER_FILES if not (directory / name).is_file()]
    base = base_model or _recorded_base_model(directory)
    fix = "copy the tokenizer files of the model it was fine-tuned from into it"
    if base:
        fix = (
            "save its base model's tokenizer into it: python -c "
            '"from transformers import AutoTokenizer; '
            f"AutoTokenizer.from_pretrained('{base}').save_pretrained('{directory}')\""
        )
    raise CheckpointError(
        f"could not load checkpoint {directory}: its tokenizer is missing (no {', '.join(missing)}); {fix}"
    )


def _recorded_base_model(directory: Path) -> str | None:
    try:
        return read_servable_info(directory).model_name or None
    except CheckpointError:
        return None  # no, damaged or refused distrinews.json: the message just names no base model

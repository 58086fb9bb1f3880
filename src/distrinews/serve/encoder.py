"""A checkpoint's ``tokenizer.json`` through the ``tokenizers`` library alone: the same token ids as
``transformers``' fast tokenizer called as ``tokenizer(texts, truncation=True, max_length=N, padding=True)``,
without importing ``transformers`` (or torch), so a slim ONNX Runtime server can tokenize.

``save_pretrained`` stores the padding and truncation it was last called with in
``tokenizer.json`` (a fixed 128-token pad, say); both are set here explicitly to what the
predictor asks for: truncate to ``max_length``, pad each batch to its own longest text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


def _token(value: object, default: str) -> str:
    """A special token as ``tokenizer_config.json`` spells it: a string, or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else default


class TokenizerJsonEncoder:
    def __init__(self, directory: str | Path, max_length: int):
        from tokenizers import Tokenizer

        directory = Path(directory)
        self.tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        config_path = directory / TOKENIZER_CONFIG
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        pad_token = _token(config.get("pad_token"), "[PAD]")
        pad_id = self.tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"{directory / TOKENIZER_FILE}: the padding token {pad_token!r} is not in the vocabulary")
        self.tokenizer.enable_truncation(max_length=max_length, direction=config.get("truncation_side", "right"))
        self.tokenizer.enable_padding(
            pad_id=pad_id,
            pad_token=pad_token,
            pad_type_id=int(config.get("pad_token_type_id", 0)),
            direction=config.get("padding_side", "right"),
        )

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        encodings = self.tokenizer.encode_batch(list(texts))
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }

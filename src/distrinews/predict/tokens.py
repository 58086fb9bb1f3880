"""Tokenization for serving, apart from the forward pass: text -> token ids, then a batch -> padded arrays.

``TextEncoder.encode`` gives :class:`Encoded` texts (ids truncated to ``max_length``, not padded) on the
micro-batcher's tokenizer thread, so a request's length in tokens (what the token budget counts) is known before its
batch forms; ``encode_fitted`` adds text-embeddings-inference's ``truncate: false`` and ``truncation_direction:
left``. ``collate`` pads a batch to its longest text (microseconds, on the forward thread).

The ids are those of ``transformers``' fast tokenizer called with ``truncation=True, max_length=N, padding=True``
(a test checks all 7,600 test rows), computed by the Rust ``tokenizers`` library directly: the Python wrapper costs
about as much as the tokenization, and the Rust call releases the GIL. ``from_tokenizer_json`` needs no
``transformers`` (the slim ONNX Runtime server).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint.records import read_json

# The inputs a BERT-style encoder takes; anything else the tokenizer returns is dropped.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


def _token(value: object, default: str) -> str:
    """A special token as ``tokenizer_config.json`` spells it: a string, or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else default


class TextTooLong(ValueError):
    """A text is longer than the model reads, and the caller asked not to cut it (TEI's ``truncate: false``)."""

    def __init__(self, tokens: int, max_length: int):
        super().__init__(f"a text has {tokens} tokens; the model reads at most {max_length}")
        self.tokens, self.max_length = tokens, max_length


@dataclass(slots=True, eq=False)  # eq: numpy arrays do not compare to one bool
class Encoded:
    """One text's token ids (and token type ids), unpadded; ``len()`` is its length in tokens."""

    ids: np.ndarray
    type_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Encoded({len(self.ids)} tokens)"


class TextEncoder:
    """Texts -> :class:`Encoded` -> one padded batch of int64 arrays named like the model's inputs."""

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        input_names: Sequence[str] = MODEL_INPUTS,
        pad_id: int = 0,
        pad_type_id: int = 0,
        padding_side: str = "right",
        truncation_side: str = "right",
    ):
        """``tokenizer`` is a ``tokenizers.Tokenizer``; this encoder keeps a private copy configured
        to truncate to ``max_length`` and never pad (``tokenizer.json`` may carry a fixed padding)."""
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length, strategy="longest_first", direction=truncation_side)
        self.max_length = max_length
        self.input_names = [name for name in MODEL_INPUTS if name in input_names]
        self.pad_id, self.pad_type_id = pad_id, pad_type_id
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        self.padding_side = padding_side

    @classmethod
    def from_transformers(cls, tokenizer: Any, max_length: int) -> TextEncoder:
        """From a ``transformers`` fast tokenizer (its Rust backend and its padding settings)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(f"{type(tokenizer).__name__} is not a fast (Rust-backed) tokenizer")
        return cls(
            backend,
            max_length,
            input_names=tokenizer.model_input_names,
            pad_id=tokenizer.pad_token_id or 0,
            pad_type_id=getattr(tokenizer, "pad_token_type_id", 0) or 0,
            padding_side=tokenizer.padding_side,
            truncation_side=tokenizer.truncation_side,
        )

    @classmethod
    def from_tokenizer_json(cls, directory: str | Path, max_length: int) -> TextEncoder:
        """From a checkpoint folder's ``tokenizer.json`` and ``tokenizer_config.json`` (padding token and sides),
        through ``tokenizers`` alone; the fixed padding and truncation ``save_pretrained`` may store are replaced, as
        ``transformers`` does per call. Every one of MODEL_INPUTS is made; the ONNX forward feeds its graph's."""
        from tokenizers import Tokenizer

        directory = Path(directory)
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        config_path = directory / TOKENIZER_CONFIG
        config = read_json(config_path) if config_path.is_file() else {}
        pad_token = _token(config.get("pad_token"), "[PAD]")
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"{directory / TOKENIZER_FILE}: the padding token {pad_token!r} is not in the vocabulary")
        return cls(
            tokenizer,
            max_length,
            pad_id=pad_id,
            pad_type_id=int(config.get("pad_token_type_id", 0)),
            padding_side=config.get("padding_side", "right"),
            truncation_side=config.get("truncation_side", "right"),
        )

    @functools.cached_property
    def _whole(self) -> Any:
        """A copy that never truncates: a text's whole length is known before it is cut (``encode_fitted``)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
        tokenizer.no_truncation()
        return tokenizer

    def encode_fitted(self, texts: Sequence[str], truncate: bool = True, keep_end: bool = False) -> list[Encoded]:
        """``encode`` with text-embeddings-inference's options, each text tokenized once: ``truncate`` False refuses a
        text over ``max_length`` tokens (:class:`TextTooLong`); ``keep_end`` keeps the last whole words that fit."""
        if truncate and not keep_end:
            return self.encode(texts)
        fitted = []
        for enc in self._whole.encode_batch(list(texts)):
            ids, type_ids = np.asarray(enc.ids, dtype=np.int64), np.asarray(enc.type_ids, dtype=np.int64)
            if len(ids) > self.max_length:
                if not truncate:
                    raise TextTooLong(len(ids), self.max_length)
                keep = self._kept_end(enc)
                ids, type_ids = ids[keep], type_ids[keep]
            fitted.append(Encoded(ids, type_ids))
        return fitted

    def _kept_end(self, enc: Any) -> np.ndarray:
        """What ``keep_end`` keeps of a too long encoding: its special tokens and the last whole words that fit."""
        special = np.asarray(enc.special_tokens_mask, dtype=bool)
        content = np.flatnonzero(~special)
        budget = max(self.max_length - int(special.sum()), 1)
        first = start = len(content) - budget
        words = enc.word_ids
        while start < len(content) and start > 0 and words[content[start]] == words[content[start - 1]]:
            start += 1  # the first kept token continues a word: start at the next whole word
        if start == len(content):
            start = first
        mask: np.ndarray = special | (np.arange(len(special)) >= content[start])
        return mask

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        encodings = self.tokenizer.encode_batch(list(texts))
        return [Encoded(np.asarray(e.ids, dtype=np.int64), np.asarray(e.type_ids, dtype=np.int64)) for e in encodings]

    def collate(self, batch: Sequence[Encoded]) -> dict[str, np.ndarray]:
        """Pad to the batch's longest text: ``input_ids``, ``attention_mask`` (and ``token_type_ids``)."""
        lengths = np.fromiter((len(e) for e in batch), dtype=np.int64, count=len(batch))
        width = int(lengths.max()) if len(batch) else 0
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        type_ids = np.full((len(batch), width), self.pad_type_id, dtype=np.int64)
        starts = np.zeros_like(lengths) if self.padding_side == "right" else width - lengths
        for row, (e, start) in enumerate(zip(batch, starts)):
            ids[row, start : start + len(e)] = e.ids
            type_ids[row, start : start + len(e)] = e.type_ids
        positions = np.arange(width)[None, :]
        mask = (positions >= starts[:, None]) & (positions < (starts + lengths)[:, None])
        arrays = {"input_ids": ids, "attention_mask": mask.astype(np.int64), "token_type_ids": type_ids}
        return {name: arrays[name] for name in self.input_names}

"""Batched inference over a checkpoint directory (or the seed's ``.pt`` file), with PyTorch or ONNX Runtime.

Both runtimes share one interface (``predict``, ``logits``, ``labels``, ``info``, ``max_length``,
``runtime``) and one output format, so the HTTP app and the CLI do not care which one runs.

Importing this module needs neither torch nor transformers. ONNX Runtime on a checkpoint
directory that has its ONNX file, ``tokenizer.json`` and ``config.json`` needs only
onnxruntime, tokenizers and numpy (the Space bundle's slim image, ``distrinews.space``);
torch and transformers are imported where a runtime needs them: the PyTorch predictor, and
the ONNX one when it must export the model first or read a legacy ``.pt`` file.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .encoder import TOKENIZER_FILE, TokenizerJsonEncoder

log = logging.getLogger(__name__)

RUNTIMES = ("torch", "onnx")
# The inputs a BERT-style encoder takes; anything else the tokenizer returns is dropped.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SERVABLE_INFO = "distrinews.json"  # the same name checkpoint.py writes (not imported: it needs torch)
# Operators that only a quantized graph has (onnxruntime.quantization's dynamic int8 output).
QUANTIZED_OPS = (b"DynamicQuantizeLinear", b"MatMulInteger", b"DynamicQuantizeMatMul")


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(shifted - shifted.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class Predictor:
    """Tokenize with dynamic padding, one forward pass per batch, softmax, named labels."""

    runtime = "torch"

    def __init__(self, checkpoint: str | os.PathLike, device: Any = None, max_batch_size: int = 64):
        import torch

        from ..checkpoint import load_for_inference

        self.checkpoint = Path(checkpoint)
        self.model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self._init_common(_labels_of(self.model.config), max_batch_size, getattr(self.model.config, "name_or_path", None))

    def _init_common(self, labels: list[str], max_batch_size: int, fallback_name: str | None = None) -> None:
        self.max_length = int(self.info.get("max_length", 128))
        self.labels = labels
        self.model_name = self.info.get("model_name") or fallback_name or str(self.checkpoint)
        self.max_batch_size = max_batch_size

    def tokenize(self, texts: Sequence[str], return_tensors: str) -> dict[str, Any]:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=True, return_tensors=return_tensors)
        return {k: v for k, v in enc.items() if k in MODEL_INPUTS}

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            enc = {k: v.to(self.device) for k, v in self.tokenize(texts, "pt").items()}
            return self.model(**enc).logits.float().cpu().numpy()

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text, in order. Texts are grouped by length so each batch pads little."""
        if isinstance(texts, str):
            raise TypeError("predict() takes a list of texts")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        results: list[dict[str, Any] | None] = [None] * len(texts)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            probs = softmax(self.logits([texts[i] for i in chunk]))
            for i, p in zip(chunk, probs):
                results[i] = self.format(p)
        return results  # type: ignore[return-value]

    def format(self, probs: np.ndarray) -> dict[str, Any]:
        label_id = int(np.argmax(probs))
        return {
            "label": self.labels[label_id],
            "label_id": label_id,
            "confidence": float(probs[label_id]),
            "probabilities": {name: float(probs[i]) for i, name in enumerate(self.labels)},
        }

    def warmup(self) -> None:
        """One short and one padded batch, so the first real request does not pay for lazy initialisation."""
        self.predict(["warm up", "warm up the model with a slightly longer sentence"])

    def describe(self) -> dict[str, Any]:
        """What ``GET /info`` reports about the model."""
        return {
            "model_name": self.model_name,
            "model_version": self.info.get("model_version"),
            "config_hash": self.info.get("config_hash"),
            "checkpoint": str(self.checkpoint),
            "checkpoint_format": self.info.get("format"),
            "runtime": self.runtime,
            "labels": list(self.labels),
            "max_length": self.max_length,
            "metrics": self.info.get("metrics") or {},
            "epoch": self.info.get("epoch"),
            "global_step": self.info.get("global_step"),
        }


def _labels_of(model_config: Any) -> list[str]:
    return [model_config.id2label[i] for i in range(model_config.num_labels)]


def is_quantized_file(path: str | os.PathLike) -> bool:
    """Whether an ONNX file holds quantized operators, without the ``onnx`` package (the slim image has none):
    a protobuf stores each node's op type as plain bytes."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(op) >= 0 for op in QUANTIZED_OPS)


def _standalone_labels(directory: Path) -> list[str] | None:
    """The labels of a Hugging Face folder that a slim server can run from alone (its tokenizer.json and
    a config.json with id2label), else None."""
    if not (directory.is_dir() and (directory / TOKENIZER_FILE).is_file() and (directory / "config.json").is_file()):
        return None
    config = json.loads((directory / "config.json").read_text())
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return None  # e.g. a resumable step-N directory, whose config.json is the training config
    return [id2label[key] for key in sorted(id2label, key=int)]


class OnnxPredictor(Predictor):
    """The same predictor on ONNX Runtime (CPU): ``DIR/model.onnx`` if present, else exported at start.

    ``onnx_model`` picks a file explicitly (e.g. the int8 model written by
    ``distrinews export --format onnx --quantize int8``). With an ONNX file and a checkpoint
    directory holding ``tokenizer.json``, nothing but onnxruntime, tokenizers and numpy is
    imported; otherwise the checkpoint is loaded with transformers (and exported if needed).
    """

    runtime = "onnx"

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        onnx_model: str | os.PathLike | None = None,
        max_batch_size: int = 64,
        threads: int | None = None,
    ):
        import onnxruntime as ort

        self.checkpoint = Path(checkpoint)
        path = Path(onnx_model) if onnx_model else self.checkpoint / "model.onnx"
        if onnx_model and not path.is_file():
            raise FileNotFoundError(f"ONNX model {path} does not exist")
        self._tmpdir = None
        labels = _standalone_labels(self.checkpoint) if path.is_file() else None
        if labels is not None:
            info_path = self.checkpoint / SERVABLE_INFO
            self.info = {**(json.loads(info_path.read_text()) if info_path.is_file() else {}), "format": "pretrained"}
            self._init_common(labels, max_batch_size)
            self._encode: Callable[[Sequence[str]], dict[str, Any]] = TokenizerJsonEncoder(self.checkpoint, self.max_length)
        else:
            path = self._load_with_transformers(path, max_batch_size)
        self.onnx_path = path
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self._input_names = [i.name for i in self.session.get_inputs()]
        self.quantized = is_quantized_file(path)

    def _load_with_transformers(self, path: Path, max_batch_size: int) -> Path:
        """A legacy ``.pt`` file, a step-N directory, or no ONNX file yet: load (and export) with torch."""
        from ..checkpoint import load_for_inference

        # The tokenizer, labels and metadata come from the checkpoint itself; the PyTorch
        # weights are only kept long enough to export them when no ONNX file exists yet.
        model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self._init_common(_labels_of(model.config), max_batch_size, getattr(model.config, "name_or_path", None))
        self._encode = lambda texts: self.tokenize(texts, "np")
        if not path.is_file():
            from .onnx_export import export_model

            self._tmpdir = tempfile.TemporaryDirectory(prefix="distrinews-onnx-")
            path = Path(self._tmpdir.name) / "model.onnx"
            log.info("no ONNX model beside %s: exporting one to %s", self.checkpoint, path)
            export_model(model, self.tokenizer, path)
        del model
        return path

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        enc = self._encode(texts)
        feed = {name: np.asarray(enc[name]).astype("int64") for name in self._input_names}
        (logits,) = self.session.run(["logits"], feed)
        return np.asarray(logits, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "onnx_model": str(self.onnx_path), "onnx_quantized": self.quantized}


def make_predictor(
    checkpoint: str | os.PathLike, runtime: str = "torch", max_batch_size: int = 64, onnx_model: str | os.PathLike | None = None
) -> Predictor:
    """The predictor for ``--runtime``: ``torch`` (default) or ``onnx``."""
    if runtime == "torch":
        if onnx_model:
            raise ValueError("--onnx-model only applies to --runtime onnx")
        return Predictor(checkpoint, max_batch_size=max_batch_size)
    if runtime == "onnx":
        return OnnxPredictor(checkpoint, onnx_model=onnx_model, max_batch_size=max_batch_size)
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")

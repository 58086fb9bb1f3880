"""Batched inference over a checkpoint directory (or the seed's ``.pt`` file), with PyTorch or ONNX Runtime.

Both runtimes share one interface (``predict``, ``logits``, ``labels``, ``info``, ``max_length``,
``runtime``) and one output format, so the HTTP app and the CLI do not care which one runs.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_for_inference

log = logging.getLogger(__name__)

RUNTIMES = ("torch", "onnx")
# The inputs a BERT-style encoder takes; anything else the tokenizer returns is dropped.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Predictor:
    """Tokenize with dynamic padding, one forward pass per batch, softmax, named labels."""

    runtime = "torch"

    def __init__(self, checkpoint: str | os.PathLike, device: str | torch.device | None = None, max_batch_size: int = 64):
        self.checkpoint = Path(checkpoint)
        self.model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self._init_common(self.model.config, max_batch_size)

    def _init_common(self, model_config, max_batch_size: int) -> None:
        self.max_length = int(self.info.get("max_length", 128))
        self.labels = [model_config.id2label[i] for i in range(model_config.num_labels)]
        self.model_name = self.info.get("model_name") or getattr(model_config, "name_or_path", None) or str(self.checkpoint)
        self.max_batch_size = max_batch_size

    def tokenize(self, texts: Sequence[str], return_tensors: str) -> dict[str, Any]:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=True, return_tensors=return_tensors)
        return {k: v for k, v in enc.items() if k in MODEL_INPUTS}

    @torch.inference_mode()
    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        enc = {k: v.to(self.device) for k, v in self.tokenize(texts, "pt").items()}
        return self.model(**enc).logits.float().cpu()

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text, in order. Texts are grouped by length so each batch pads little."""
        if isinstance(texts, str):
            raise TypeError("predict() takes a list of texts")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        results: list[dict[str, Any] | None] = [None] * len(texts)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            probs = torch.softmax(self.logits([texts[i] for i in chunk]), dim=-1)
            for i, p in zip(chunk, probs):
                results[i] = self.format(p)
        return results  # type: ignore[return-value]

    def format(self, probs: torch.Tensor) -> dict[str, Any]:
        label_id = int(probs.argmax())
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
            "checkpoint": str(self.checkpoint),
            "checkpoint_format": self.info.get("format"),
            "runtime": self.runtime,
            "labels": list(self.labels),
            "max_length": self.max_length,
            "metrics": self.info.get("metrics") or {},
            "epoch": self.info.get("epoch"),
            "global_step": self.info.get("global_step"),
        }


class OnnxPredictor(Predictor):
    """The same predictor on ONNX Runtime (CPU): ``DIR/model.onnx`` if present, else exported at start.

    ``onnx_model`` picks a file explicitly (e.g. the int8 model written by
    ``distrinews export --format onnx --quantize int8``).
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

        from .onnx_export import export_model, is_quantized

        self.checkpoint = Path(checkpoint)
        # The tokenizer, labels and metadata come from the checkpoint itself; the PyTorch
        # weights are only kept long enough to export them when no ONNX file exists yet.
        model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self._init_common(model.config, max_batch_size)
        path = Path(onnx_model) if onnx_model else self.checkpoint / "model.onnx"
        self._tmpdir = None
        if onnx_model and not path.is_file():
            raise FileNotFoundError(f"ONNX model {path} does not exist")
        if not path.is_file():
            self._tmpdir = tempfile.TemporaryDirectory(prefix="distrinews-onnx-")
            path = Path(self._tmpdir.name) / "model.onnx"
            log.info("no ONNX model beside %s: exporting one to %s", self.checkpoint, path)
            export_model(model, self.tokenizer, path)
        del model
        self.onnx_path = path
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self._input_names = [i.name for i in self.session.get_inputs()]
        self.quantized = is_quantized(path)

    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.tokenize(texts, "np")
        feed = {name: enc[name].astype("int64") for name in self._input_names}
        (logits,) = self.session.run(["logits"], feed)
        return torch.from_numpy(logits).float()

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

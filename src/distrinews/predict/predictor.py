"""The PyTorch predictor, and the interface and output format every runtime shares (``runtimes.py`` picks one).

The HTTP app's part of the interface is ``protocol.ServingPredictor``. A prediction is three steps, kept apart so
the server can run them on different threads: ``encode(texts)`` (tokenization only, ``tokens.TextEncoder``; any
thread), ``forward(inputs)`` (padded int64 arrays in, float32 logits out) and ``format_batch(logits)``: softmax of
the logits divided by the checkpoint's temperature (fitted when training ended, ``train/calibration.py``; 1 where
it has none), named labels, and with a ``min_confidence`` (``confidence.py``) whether the answer is ``confident``.
A multi-label model (``problem_type`` multi_label_classification) answers with a sigmoid per label and every label
at or over its threshold (tuned when training, else 0.5; ``min_confidence`` replaces those it names):
``{"labels": [{"label", "label_id", "score"}, ...] (highest first, possibly none), "probabilities"}``.

Importing this module needs neither torch nor transformers (``onnx_runtime.OnnxPredictor`` derives from it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import records
from ..checkpoint.records import DEFAULT_THRESHOLD, ModelInfo
from ..errors import CheckpointError
from .confidence import ConfidenceThreshold
from .tokens import Encoded, TextEncoder

MULTI_LABEL = "multi_label_classification"  # transformers' problem_type (config's, which this module cannot import)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Each logit's probability on its own (float64): a multi-label model's scores."""
    x = np.asarray(logits, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflow for large |x|


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities of ``logits / temperature`` (float64), per row."""
    shifted = np.asarray(logits, dtype=np.float64) / temperature
    shifted = np.exp(shifted - shifted.max(axis=-1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=-1, keepdims=True)
    return probabilities


class Predictor:
    """PyTorch: tokenize, pad each batch to its own longest text, one forward pass per batch, softmax, named labels."""

    runtime = "torch"
    # How the runtime was chosen: asked for by name, or picked by ``auto`` (and why). ``/info`` reports it.
    choice: dict[str, Any] | None = None
    info: ModelInfo  # what the checkpoint says about its model (checkpoint.records)
    min_confidence: ConfidenceThreshold | None = None  # below it an answer is marked "confident": false
    multi_label = False  # a sigmoid per label and every label over its threshold (the model config's problem_type)
    thresholds: list[float] | None = None  # multi-label: each label's least score to be in the answer

    def __init__(
        self, checkpoint: str | os.PathLike[str], device: Any = None, max_batch_size: int = 64, bf16: bool = False
    ):
        import torch

        from ..checkpoint.servable import load_for_inference

        self.checkpoint = Path(checkpoint)
        self.model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self.autocast_dtype = torch.bfloat16 if bf16 else None
        self.runtime = "torch-bf16" if bf16 else "torch"
        self._init_loaded(self.model, max_batch_size)

    def _init_loaded(self, model: Any, max_batch_size: int) -> None:
        """From a model ``load_for_inference`` loaded: its labels and problem type, the transformers tokenizer."""
        config = model.config
        labels = [config.id2label[i] for i in range(config.num_labels)]
        name, problem_type = getattr(config, "name_or_path", None), getattr(config, "problem_type", None)
        self._init_common(labels, max_batch_size, name, problem_type)
        self.encoder = TextEncoder.from_transformers(self.tokenizer, self.max_length)

    def _init_common(
        self, labels: list[str], max_batch_size: int, fallback_name: str | None = None, problem_type: str | None = None
    ) -> None:
        self.max_length = int(self.info.max_length)
        self.labels = labels
        self.model_name = self.info.model_name or fallback_name or str(self.checkpoint)
        self.max_batch_size = max_batch_size
        self.temperature = float(self.info.temperature)
        self.multi_label = problem_type == MULTI_LABEL
        if self.multi_label:
            tuned = self.info.thresholds or {}
            self.thresholds = [float(tuned.get(name, DEFAULT_THRESHOLD)) for name in labels]

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Token ids per text, truncated to ``max_length``, not padded. Thread-safe; releases the GIL."""
        return self.encoder.encode(texts)

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Padded int64 arrays (``TextEncoder.collate``) -> float32 logits, one forward pass."""
        import torch

        bf16 = self.autocast_dtype is not None
        with torch.inference_mode(), torch.autocast(self.device.type, self.autocast_dtype, enabled=bf16):
            feed = {k: torch.from_numpy(v).to(self.device) for k, v in inputs.items()}
            logits: np.ndarray = self.model(**feed).logits.float().cpu().numpy()
            return logits

    def predict_encoded(self, batch: Sequence[Encoded]) -> list[dict[str, Any]]:
        """One forward pass over already-tokenized texts: the micro-batcher's job on its forward thread."""
        return self.format_batch(self.forward(self.encoder.collate(batch)))

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """[N, labels] float32 logits as the model gives them (before the temperature), in the texts' order, computed
        in length-sorted batches of ``max_batch_size`` so that each pads little."""
        encoded = self.encode(texts)
        out = np.empty((len(encoded), len(self.labels)), dtype=np.float32)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        for chunk in (order[s : s + self.max_batch_size] for s in range(0, len(order), self.max_batch_size)):
            out[chunk] = self.forward(self.encoder.collate([encoded[i] for i in chunk]))
        return out

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text, in order."""
        if isinstance(texts, str):
            raise TypeError("predict() takes a list of texts")
        return self.format_batch(self.logits(texts))

    def format_batch(self, logits: np.ndarray) -> list[dict[str, Any]]:
        if self.multi_label:
            return [self.format_multi_label(p) for p in sigmoid(logits).tolist()]
        return [self.format(p) for p in softmax(logits, self.temperature).tolist()]

    def label_thresholds(self) -> list[float]:
        """A multi-label model's threshold per label: ``min_confidence``'s where it gives one, else the tuned one."""
        assert self.thresholds is not None, "a multi-label predictor has thresholds"
        given = self.min_confidence.minimum if self.min_confidence is not None else lambda name: None
        return [tuned if (least := given(name)) is None else least for name, tuned in zip(self.labels, self.thresholds)]

    def format_multi_label(self, scores: Sequence[float]) -> dict[str, Any]:
        """Every label whose score reaches its threshold, highest first (none is an answer too), and every score."""
        scores = [float(p) for p in scores]
        over = [i for i, (p, t) in enumerate(zip(scores, self.label_thresholds())) if p >= t]
        over.sort(key=lambda i: -scores[i])
        return {
            "labels": [{"label": self.labels[i], "label_id": i, "score": scores[i]} for i in over],
            "probabilities": dict(zip(self.labels, scores)),
        }

    def format(self, probs: Sequence[float]) -> dict[str, Any]:
        probs = [float(p) for p in probs]
        label_id = max(range(len(probs)), key=probs.__getitem__)  # the first of equal maxima, like argmax
        result = {
            "label": self.labels[label_id],
            "label_id": label_id,
            "confidence": probs[label_id],
            "probabilities": dict(zip(self.labels, probs)),
        }
        if self.min_confidence is not None:
            result["confident"] = self.min_confidence.confident(self.labels[label_id], probs[label_id])
        return result

    def set_min_confidence(self, spec: Any) -> None:
        """``--min-confidence`` (``ConfidenceThreshold.parse``'s forms; None: none), checked against the labels."""
        threshold = ConfidenceThreshold.parse(spec)
        self.min_confidence = None if threshold is None else threshold.for_labels(self.labels)

    def warmup(self) -> None:
        """One short, two padded and one long text, so that the first requests do not pay for lazy initialisation."""
        self.predict(["warm up"])
        self.predict(["warm up", "warm up the model with a slightly longer sentence"])
        self.predict(["warm up with the longest text the model reads " * 40])

    def describe(self) -> dict[str, Any]:
        """What ``GET /info`` reports about the model."""
        return {
            "model_name": self.model_name,
            "model_version": self.info.model_version,
            "config_hash": self.info.config_hash,
            "checkpoint": str(self.checkpoint),
            "checkpoint_format": self.info.checkpoint_format,
            # Where the token ids come from: a model is only right with the tokenizer it was trained with.
            "tokenizer": self.info.tokenizer.to_json(),
            "runtime": self.runtime,
            "runtime_choice": self.choice
            or {"requested": self.runtime, "runtime": self.runtime, "reason": "asked for by name"},
            "labels": list(self.labels),
            "max_length": self.max_length,
            "temperature": self.temperature,
            "problem_type": MULTI_LABEL if self.multi_label else "single_label_classification",
            "thresholds": None if self.thresholds is None else dict(zip(self.labels, self.thresholds)),
            "min_confidence": None if self.min_confidence is None else self.min_confidence.to_json(),
            "metrics": self.info.metrics,
            "epoch": self.info.epoch,
            "global_step": self.info.global_step,
        }


def folder_config(checkpoint: str | os.PathLike[str] | None) -> dict[str, Any]:
    """A folder checkpoint's ``config.json`` (a model's, or a step-N's training config); {} for a ``.pt`` or none."""
    found = records.describe(checkpoint) if checkpoint is not None else None
    config = records.read_json(found.path / "config.json") if found is not None and found.kind != "pt" else {}
    return config if isinstance(config, dict) else {}


def config_labels(config: dict[str, Any]) -> list[str] | None:
    """A model config's labels in id order; None where it gives none (or ids that are not numbers)."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label or not all(str(key).isdigit() for key in id2label):
        return None
    return [str(id2label[key]) for key in sorted(id2label, key=int)]


def checkpoint_labels(checkpoint: str | os.PathLike[str] | None) -> list[str] | None:
    """A checkpoint's labels read from its files without loading it (a model folder's id2label, a step-N's
    ``trainer_state.json``), else None, also where a file is refused: for what is shown before the model loads,
    and loading says why in one line."""
    found = records.describe(checkpoint) if checkpoint is not None else None
    try:
        if found is not None and found.kind == "resumable":
            return list(records.read_trainer_state(found.path).label_names) or None
        return config_labels(folder_config(checkpoint))
    except CheckpointError:
        return None


def checkpoint_multi_label(checkpoint: str | os.PathLike[str] | None) -> bool:
    return folder_config(checkpoint).get("problem_type") == MULTI_LABEL

"""Batched inference over a checkpoint directory (or the seed's ``.pt`` file), with PyTorch or ONNX Runtime.

Every runtime shares one interface (the HTTP app's part of it: ``protocol.ServingPredictor``) and
one output format, so the HTTP app and the CLI do not care which one runs. A prediction is three
steps, kept apart so the server can run them on different threads:

- ``encode(texts)``: tokenization only (``tokens.TextEncoder``; no model, any thread);
- ``forward(inputs)``: padded int64 arrays in, float32 logits out (the runtime's forward pass);
- ``format_batch(logits)``: softmax of the logits divided by the checkpoint's temperature (``distrinews.json``,
  fitted when training ended: ``train/calibration.py``; 1 where it has none), named labels, and with a
  ``min_confidence`` threshold (``confidence.py``) whether the answer is ``confident``. A multi-label model
  (its config's ``problem_type`` is multi_label_classification) answers with a sigmoid per label instead, and
  every label whose score is at least its threshold (``distrinews.json``'s ``thresholds``, tuned when training;
  0.5 where none is recorded; ``min_confidence`` replaces those of the labels it gives a number for):
  ``{"labels": [{"label", "label_id", "score"}, ...] (highest first, possibly none), "probabilities"}``.

``predict_encoded`` is the micro-batcher's forward job (collate + forward + format, one pass);
``predict(texts)`` does all three for the CLI, in length-sorted chunks of ``max_batch_size``.

Runtimes (``--runtime``): ``torch`` (fp32), ``torch-bf16`` (bf16 autocast; only where the device
computes bf16 in hardware, ``distributed.machine.bf16_is_fast``), ``onnx`` (ONNX Runtime fp32) and
``onnx-int8`` (dynamic int8 quantization). The default, ``auto``, is a rule, not a runtime: the
fastest runtime whose accuracy stays within 0.2 points of PyTorch fp32, which is ``onnx-int8``
on every CPU measured (benchmarks/serving.md) where this checkpoint's int8 model passed its check
(``int8.py``); otherwise ``torch``, said in one log line and in ``/info``'s ``runtime_choice``.

Importing this module needs neither torch nor transformers. ONNX Runtime on a checkpoint
directory that has its ONNX file, ``tokenizer.json`` and ``config.json`` needs only
onnxruntime, tokenizers and numpy (the Space bundle's slim image, ``distrinews.export.space``);
torch and transformers are imported where a runtime needs them: the PyTorch predictors, and
the ONNX ones when they must export (or quantize) the model first or read a legacy ``.pt`` file.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import records
from ..checkpoint.records import DEFAULT_THRESHOLD, ModelInfo, ServableInfo, TokenizerSource
from ..errors import CheckpointError
from . import int8
from .confidence import ConfidenceThreshold
from .tokens import MODEL_INPUTS, TOKENIZER_FILE, Encoded, TextEncoder

MULTI_LABEL = "multi_label_classification"  # transformers' problem_type (config's, which this module cannot import)

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "torch-bf16", "onnx", "onnx-int8")
DEFAULT_RUNTIME = "auto"
__all__ = [
    "DEFAULT_RUNTIME",
    "MODEL_INPUTS",
    "RUNTIMES",
    "ConfidenceThreshold",
    "OnnxPredictor",
    "Predictor",
    "is_quantized_file",
    "make_predictor",
    "softmax",
]
# Operators that only a quantized graph has (onnxruntime.quantization's dynamic int8 output).
QUANTIZED_OPS = (b"DynamicQuantizeLinear", b"MatMulInteger", b"DynamicQuantizeMatMul")


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Each logit's probability on its own (float64): a multi-label model's scores."""
    x = np.asarray(logits, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflow for large |x|


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities of ``logits / temperature`` (float64), per row."""
    shifted = np.asarray(logits, dtype=np.float64) / temperature
    shifted = np.exp(shifted - shifted.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class Predictor:
    """PyTorch: tokenize, pad each batch to its own longest text, one forward pass per batch, softmax, named labels."""

    runtime = "torch"
    # How the runtime was chosen: asked for by name, or picked by ``auto`` (and why). ``/info`` reports it.
    choice: dict[str, Any] | None = None
    info: ModelInfo  # what the checkpoint says about its model (checkpoint.records)
    min_confidence: ConfidenceThreshold | None = None  # below it an answer is marked "confident": false
    multi_label = False  # a sigmoid per label and every label over its threshold (the model config's problem_type)
    thresholds: list[float] | None = None  # multi-label: each label's least score to be in the answer

    def __init__(self, checkpoint: str | os.PathLike, device: Any = None, max_batch_size: int = 64, bf16: bool = False):
        import torch

        from ..checkpoint.servable import load_for_inference

        self.checkpoint = Path(checkpoint)
        self.model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self.autocast_dtype = torch.bfloat16 if bf16 else None
        if bf16:
            self.runtime = "torch-bf16"
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

    # ------------------------------------------------------------------ tokenization (no model)
    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Token ids per text, truncated to ``max_length``, not padded. Thread-safe; releases the GIL."""
        return self.encoder.encode(texts)

    def tokenize(self, texts: Sequence[str], return_tensors: str) -> dict[str, Any]:
        """The padded batch through ``transformers`` itself (the reference the encoder is checked against)."""
        enc = self.tokenizer(
            list(texts), truncation=True, max_length=self.max_length, padding=True, return_tensors=return_tensors
        )
        return {k: v for k, v in enc.items() if k in MODEL_INPUTS}

    # ------------------------------------------------------------------ the forward pass
    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """Padded int64 arrays (``TextEncoder.collate``) -> float32 logits, one forward pass."""
        import contextlib

        import torch

        autocast = (
            torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            feed = {k: torch.from_numpy(v).to(self.device) for k, v in inputs.items()}
            return self.model(**feed).logits.float().cpu().numpy()

    def predict_encoded(self, batch: Sequence[Encoded]) -> list[dict[str, Any]]:
        """One forward pass over already-tokenized texts: the micro-batcher's job on its forward thread."""
        return self.format_batch(self.forward(self.encoder.collate(batch)))

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """[N, labels] float32 logits as the model gives them (before the temperature), in the texts' order;
        computed in length-sorted batches of ``max_batch_size``."""
        encoded = self.encode(texts)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        out = np.empty((len(encoded), len(self.labels)), dtype=np.float32)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            out[chunk] = self.forward(self.encoder.collate([encoded[i] for i in chunk]))
        return out

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text, in order. Texts are grouped by token length so each batch pads little."""
        if isinstance(texts, str):
            raise TypeError("predict() takes a list of texts")
        encoded = self.encode(texts)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        results: list[dict[str, Any] | None] = [None] * len(encoded)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for i, result in zip(chunk, self.predict_encoded([encoded[i] for i in chunk])):
                results[i] = result
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ output
    def format_batch(self, logits: np.ndarray) -> list[dict[str, Any]]:
        if self.multi_label:
            return [self.format_multi_label(p) for p in sigmoid(logits).tolist()]
        return [self.format(p) for p in softmax(logits, self.temperature).tolist()]

    def label_thresholds(self) -> list[float]:
        """A multi-label model's threshold per label: ``min_confidence``'s where it gives one, else the tuned one."""
        assert self.thresholds is not None, "a multi-label predictor has thresholds"
        chosen = []
        for name, tuned in zip(self.labels, self.thresholds):
            least = None if self.min_confidence is None else self.min_confidence.minimum(name)
            chosen.append(tuned if least is None else least)
        return chosen

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
        """``--min-confidence`` (``confidence.ConfidenceThreshold.parse``'s forms; None: none), checked against the
        labels."""
        threshold = ConfidenceThreshold.parse(spec)
        self.min_confidence = None if threshold is None else threshold.for_labels(self.labels)

    def warmup(self) -> None:
        """Batches of one short, two padded and one long text, so the first real requests do not pay for lazy
        initialisation."""
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


def is_quantized_file(path: str | os.PathLike) -> bool:
    """Whether an ONNX file holds quantized operators, without the ``onnx`` package (the slim image has none):
    a protobuf stores each node's op type as plain bytes."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(op) >= 0 for op in QUANTIZED_OPS)


def _folder_config(checkpoint: str | os.PathLike | None) -> dict[str, Any]:
    """A folder checkpoint's ``config.json`` (a model folder's, or a step-N's training config); {} for a ``.pt`` or
    where there is no checkpoint."""
    found = records.describe(checkpoint) if checkpoint is not None else None
    config = records.read_json(found.path / "config.json") if found is not None and found.kind != "pt" else {}
    return config if isinstance(config, dict) else {}


def _id2label(config: dict[str, Any]) -> list[str] | None:
    """A model config's labels in id order; None where it gives none (or ids that are not numbers)."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label or not all(str(key).isdigit() for key in id2label):
        return None
    return [str(id2label[key]) for key in sorted(id2label, key=int)]


def checkpoint_labels(checkpoint: str | os.PathLike | None) -> list[str] | None:
    """A checkpoint's labels read from its files without loading it (a model folder's id2label, a step-N's
    ``trainer_state.json``), else None, also where a file is refused: for what is shown before the model loads,
    and loading says why in one line."""
    found = records.describe(checkpoint) if checkpoint is not None else None
    try:
        if found is not None and found.kind == "resumable":
            return list(records.read_trainer_state(found.path).label_names) or None
        return _id2label(_folder_config(checkpoint))
    except CheckpointError:
        return None


def checkpoint_multi_label(checkpoint: str | os.PathLike | None) -> bool:
    """Whether a checkpoint's ``config.json`` says its model is multi-label."""
    return _folder_config(checkpoint).get("problem_type") == MULTI_LABEL


class OnnxPredictor(Predictor):
    """The same predictor on ONNX Runtime (CPU).

    The graph is ``onnx_model`` if given, else ``DIR/model.onnx`` (``DIR/model.int8.onnx`` with
    ``int8=True``); a missing default file is made at start in a temporary directory: exported
    from the checkpoint, and for int8 quantized (dynamic, per-channel) from that export or from
    ``DIR/model.onnx`` when it exists. ``distrinews export --format onnx [--quantize int8]``
    writes the file beside the checkpoint once, so a server need not make it at every start.

    With that ONNX file present and a checkpoint directory holding ``tokenizer.json`` and a
    ``config.json`` with its labels, nothing but onnxruntime, tokenizers and numpy is imported
    (``tokens.TextEncoder.from_tokenizer_json``); otherwise the checkpoint is loaded with
    transformers (and exported, quantized, if needed).
    """

    runtime = "onnx"

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        onnx_model: str | os.PathLike | None = None,
        max_batch_size: int = 64,
        threads: int | None = None,
        int8: bool = False,
        spin: bool = True,
    ):
        import onnxruntime as ort

        self.checkpoint = Path(checkpoint)
        path = Path(onnx_model) if onnx_model else self.checkpoint / ("model.int8.onnx" if int8 else "model.onnx")
        if onnx_model and not path.is_file():
            raise FileNotFoundError(f"ONNX model {path} does not exist")
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        found = records.describe(self.checkpoint)
        # A model folder with its ONNX file and tokenizer.json runs on onnxruntime and tokenizers alone.
        slim = found is not None and found.kind == "pretrained" and (self.checkpoint / TOKENIZER_FILE).is_file()
        config = _folder_config(self.checkpoint) if slim and path.is_file() else {}
        labels = _id2label(config)
        if found is not None and labels is not None:
            servable = records.read_servable_info(self.checkpoint) if found.servable else None
            self.info = ModelInfo.of(
                servable or ServableInfo(label_names=labels),  # a plain folder: its labels, TrainConfig's max_length
                checkpoint_format=found.kind,
                tokenizer=TokenizerSource.checkpoint(self.checkpoint),
            )
            self.tokenizer = None  # no transformers tokenizer: the Rust one from tokenizer.json does the work
            self._init_common(labels, max_batch_size, problem_type=config.get("problem_type"))
            self.encoder = TextEncoder.from_tokenizer_json(self.checkpoint, self.max_length)
        else:
            path = self._load_with_transformers(path, max_batch_size, int8)
        self.onnx_path = path
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.spin = spin
        if not spin:  # idle threads sleep at once instead of spinning for more work (``make_predictor``'s ``spin``)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self._input_names = [i.name for i in self.session.get_inputs()]
        self.quantized = is_quantized_file(path)
        if int8:
            self.runtime = "onnx-int8"
            if not self.quantized:
                raise ValueError(
                    f"--runtime onnx-int8: {path} is not a quantized model "
                    "(make one with distrinews export --quantize int8)"
                )

    def _load_with_transformers(self, path: Path, max_batch_size: int, int8: bool) -> Path:
        """A legacy ``.pt`` file, a step-N directory, or no ONNX file yet: load (and export) with torch."""
        from ..checkpoint.servable import load_for_inference

        # The tokenizer, labels and metadata come from the checkpoint itself; the PyTorch
        # weights are only kept long enough to export them when no ONNX file exists yet.
        model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self._init_loaded(model, max_batch_size)
        if not path.is_file():
            path = self._make_onnx(model, int8)
        del model
        return path

    def _make_onnx(self, model: Any, int8: bool) -> Path:
        from .onnx import export_model, quantize_int8

        self._tmpdir = tempfile.TemporaryDirectory(prefix="distrinews-onnx-")
        tmp = Path(self._tmpdir.name)
        fp32 = self.checkpoint / "model.onnx" if self.checkpoint.is_dir() else tmp / "missing"
        if not fp32.is_file():
            fp32 = tmp / "model.onnx"
            log.info("no ONNX model beside %s: exporting one to %s", self.checkpoint, fp32)
            export_model(model, self.tokenizer, fp32)
        if not int8:
            return fp32
        log.info(
            "quantizing %s to int8 in %s (distrinews export --quantize int8 writes it beside the checkpoint once)",
            fp32,
            tmp,
        )
        out = quantize_int8(fp32, tmp / "model.int8.onnx")
        if fp32.parent == tmp:
            fp32.unlink()
        return out

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {name: inputs[name] for name in self._input_names}
        (logits,) = self.session.run(["logits"], feed)
        return np.asarray(logits, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "onnx_model": str(self.onnx_path),
            "onnx_quantized": self.quantized,
            "onnx_thread_spinning": self.spin,
        }


def bf16_refusal(device: str = "cpu") -> str | None:
    """Why ``torch-bf16`` is refused on ``device`` (None where bf16 runs in hardware)."""
    from ..distributed import machine

    if machine.bf16_is_fast(device):
        return None
    return (
        f"--runtime torch-bf16: this {device.upper()} has no bf16 matrix hardware (AVX512-BF16 or AMX), so "
        "every bf16 matmul is emulated, about 100x slower than fp32; use --runtime onnx-int8, onnx or torch"
    )


def make_predictor(
    checkpoint: str | os.PathLike,
    runtime: str = DEFAULT_RUNTIME,
    max_batch_size: int = 64,
    onnx_model: str | os.PathLike | None = None,
    threads: int | None = None,
    min_confidence: Any = None,
    spin: bool = True,
) -> Predictor:
    """The predictor for ``--runtime``: ``auto``, ``torch``, ``torch-bf16``, ``onnx`` or ``onnx-int8``.
    ``min_confidence``: ``--min-confidence`` (a number, ``LABEL=NUMBER`` pairs, a dict; ``confidence.py``).
    ``spin=False``: ONNX Runtime's idle threads sleep at once rather than spin waiting for the next pass, which
    gives their cores back to whatever shares them (a server's event loop and its clients between requests)."""
    threshold = ConfidenceThreshold.parse(min_confidence)  # a malformed one fails before the model loads
    predictor = _make_predictor(checkpoint, runtime, max_batch_size, onnx_model, threads, spin)
    predictor.set_min_confidence(threshold)
    return predictor


def _make_predictor(
    checkpoint: str | os.PathLike,
    runtime: str,
    max_batch_size: int,
    onnx_model: str | os.PathLike | None,
    threads: int | None,
    spin: bool = True,
) -> Predictor:
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if onnx_model and not runtime.startswith("onnx"):
        raise ValueError("--onnx-model only applies to --runtime onnx or onnx-int8")
    if runtime == "auto":
        return auto_predictor(checkpoint, max_batch_size, threads, spin)
    if runtime.startswith("torch"):
        _torch_threads(threads)
    if runtime == "torch":
        return Predictor(checkpoint, max_batch_size=max_batch_size)
    if runtime == "torch-bf16":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if (why := bf16_refusal(device)) is not None:
            raise ValueError(why)
        return Predictor(checkpoint, device=device, max_batch_size=max_batch_size, bf16=True)
    return OnnxPredictor(
        checkpoint,
        onnx_model=onnx_model,
        max_batch_size=max_batch_size,
        threads=threads,
        int8=runtime == "onnx-int8",
        spin=spin,
    )


def auto_predictor(
    checkpoint: str | os.PathLike, max_batch_size: int = 64, threads: int | None = None, spin: bool = True
) -> Predictor:
    """``--runtime auto``: the checkpoint's int8 model where it passed its check (made and checked at the
    first start if missing, ``int8.py``), else PyTorch fp32, with the reason in one log line and in ``choice``."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return _fall_back(
            checkpoint, max_batch_size, "onnxruntime is not installed (pip install 'distrinews[onnx]')", threads=threads
        )
    beside = int8.int8_path(checkpoint)
    cached = _cache_path(beside)  # where it goes when the checkpoint's folder is read-only
    path = cached if cached.is_file() and not beside.is_file() else beside
    predictor, check = None, None
    if path.is_file():
        predictor = OnnxPredictor(
            checkpoint, onnx_model=path, max_batch_size=max_batch_size, threads=threads, int8=True, spin=spin
        )
        check = int8.read_check(predictor.session)
        if check is not None and not int8.is_current(check, checkpoint):
            log.info(
                "runtime auto: %s was checked against other weights than %s holds now: making it again",
                path,
                checkpoint,
            )
            check = None
    if check is None:  # none yet, one made before checks were recorded, or one of other weights
        try:
            found = records.describe(checkpoint)
            info = records.read_servable_info(found.path) if found and found.servable else None
            training, labels = (info.training_config, info.label_names) if info else (None, [])
            labelled = int8.labelled_rows(training, int8.SERVE_CHECK_ROWS, labels)
            path, check = int8.make_int8(checkpoint, labelled, out=path if os.access(path.parent, os.W_OK) else cached)
        except (CheckpointError, FileNotFoundError):
            raise  # a checkpoint that cannot be loaded at all is the error to report, not a reason to fall back
        except Exception as exc:  # any other failure to make it: serve PyTorch, and say why
            why = f"its int8 model could not be made ({type(exc).__name__}: {exc})"
            return _fall_back(checkpoint, max_batch_size, why, threads=threads)
        predictor = None
    if not check["passed"]:
        return _fall_back(
            checkpoint,
            max_batch_size,
            f"its int8 model failed its check ({check['kind']}: {check['summary']})",
            check,
            threads=threads,
        )
    predictor = predictor or OnnxPredictor(
        checkpoint, onnx_model=path, max_batch_size=max_batch_size, threads=threads, int8=True, spin=spin
    )
    reason = f"int8 passed its check ({check['kind']}: {check['summary']})"
    predictor.choice = {
        "requested": "auto",
        "runtime": "onnx-int8",
        "reason": reason,
        "check": check,
        "onnx_model": str(path),
    }
    log.info("runtime auto: onnx-int8 (%s)", reason)
    return predictor


def _torch_threads(threads: int | None) -> None:
    """PyTorch's intra-op threads (``serve --threads``; a replica's share of the cores); None or 0: its default."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def _fall_back(
    checkpoint: str | os.PathLike,
    max_batch_size: int,
    reason: str,
    check: dict[str, Any] | None = None,
    threads: int | None = None,
) -> Predictor:
    log.warning("runtime auto: torch, because %s", reason)
    _torch_threads(threads)
    predictor = Predictor(checkpoint, max_batch_size=max_batch_size)
    predictor.choice = {
        "requested": "auto",
        "runtime": "torch",
        "reason": reason,
        **({"check": check} if check else {}),
    }
    return predictor


def _cache_path(path: Path) -> Path:
    """The same file name in a per-checkpoint folder of the user's cache (for a read-only checkpoint folder)."""
    import hashlib

    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distrinews" / "int8" / key / path.name

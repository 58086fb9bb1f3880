"""``OnnxPredictor``: the predictor on ONNX Runtime (``--runtime onnx`` and ``onnx-int8``).

With its ONNX file beside a checkpoint directory that holds ``tokenizer.json`` and ``config.json``, it needs only
onnxruntime, tokenizers and numpy (the Space bundle's slim image, ``distrinews.export.space``); torch and
transformers are imported where it must export (or quantize) the model first or read a legacy ``.pt`` file.
"""

from __future__ import annotations

import copy
import logging
import mmap
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import records
from ..checkpoint.records import ModelInfo, ServableInfo, TokenizerSource
from .predictor import Predictor, config_labels, folder_config
from .tokens import TOKENIZER_FILE, TextEncoder

log = logging.getLogger(__name__)

# Operators that only a quantized graph has (onnxruntime.quantization's dynamic int8 output).
QUANTIZED_OPS = (b"DynamicQuantizeLinear", b"MatMulInteger", b"DynamicQuantizeMatMul")


def is_quantized_file(path: str | os.PathLike) -> bool:
    """Whether an ONNX file holds quantized operators, without the ``onnx`` package (the slim image has none):
    a protobuf stores each node's op type as plain bytes."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(op) >= 0 for op in QUANTIZED_OPS)


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
        self.checkpoint = Path(checkpoint)
        path = Path(onnx_model) if onnx_model else self.checkpoint / ("model.int8.onnx" if int8 else "model.onnx")
        if onnx_model and not path.is_file():
            raise FileNotFoundError(f"ONNX model {path} does not exist")
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        found = records.describe(self.checkpoint)
        # A model folder with its ONNX file and tokenizer.json runs on onnxruntime and tokenizers alone.
        slim = found is not None and found.kind == "pretrained" and (self.checkpoint / TOKENIZER_FILE).is_file()
        config = folder_config(self.checkpoint) if slim and path.is_file() else {}
        labels = config_labels(config)
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
        self.onnx_path, self.spin = path, spin
        self.session = self._session(threads)
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

    def _session(self, threads: int | None) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if not self.spin:  # idle threads sleep at once rather than spin for more work (``make_predictor``'s ``spin``)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.onnx_path), sess_options=options, providers=["CPUExecutionProvider"])

    def single_threaded(self) -> OnnxPredictor:
        """The same model, encoder and settings on a second session of one intra-op thread: passes on it run side by
        side, one a core, where this session's one pass at a time spreads over every core."""
        twin = copy.copy(self)
        twin.session = self._session(1)
        return twin

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

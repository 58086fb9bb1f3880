"""``OnnxPredictor``: the predictor on ONNX Runtime (``--runtime onnx`` and ``onnx-int8``).

With its ONNX file and a checkpoint folder holding ``tokenizer.json`` and ``config.json`` it needs only onnxruntime,
tokenizers and numpy (the Space's slim image); torch and transformers are imported where it must export the model
first or read a legacy ``.pt`` file.
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
from .derived import FP32_FILE, INT8_FILE, DerivedFiles, Graph
from .predictor import Predictor, config_labels, folder_config
from .tokens import TOKENIZER_FILE, TextEncoder

log = logging.getLogger(__name__)

# Operators that only a quantized graph has (onnxruntime.quantization's dynamic int8 output).
QUANTIZED_OPS = (b"DynamicQuantizeLinear", b"MatMulInteger", b"DynamicQuantizeMatMul")


def has_quantized_ops(data: bytes | mmap.mmap) -> bool:
    """Whether an ONNX graph holds quantized operators, without the ``onnx`` package (the slim image has none):
    a protobuf stores each node's op type as plain bytes."""
    return any(data.find(op) >= 0 for op in QUANTIZED_OPS)


def is_quantized_file(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return has_quantized_ops(data)


class OnnxPredictor(Predictor):
    """The same predictor on ONNX Runtime (CPU). The graph is ``onnx_model`` if given (a file or a cache ``Graph``),
    else ``DIR/model.onnx`` (``model.int8.onnx`` with ``int8=True``) where the checkpoint folder ships one, else the
    cache's, else made at start (exported, for int8 quantized) and kept in the cache; never written into the checkpoint.
    """

    runtime = "onnx"

    def __init__(
        self,
        checkpoint: str | os.PathLike[str],
        onnx_model: str | os.PathLike[str] | Graph | None = None,
        max_batch_size: int = 64,
        threads: int | None = None,
        int8: bool = False,
        spin: bool = True,
    ):
        self.checkpoint = Path(checkpoint)
        if onnx_model is not None and not isinstance(onnx_model, Graph) and not Path(onnx_model).is_file():
            raise FileNotFoundError(f"ONNX model {onnx_model} does not exist")
        graph = self._find_graph(onnx_model, INT8_FILE if int8 else FP32_FILE)
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        found = records.describe(self.checkpoint)
        # A model folder with its ONNX file and tokenizer.json runs on onnxruntime and tokenizers alone.
        slim = found is not None and found.kind == "pretrained" and (self.checkpoint / TOKENIZER_FILE).is_file()
        config = folder_config(self.checkpoint) if slim and graph is not None else {}
        labels = config_labels(config)
        if found is not None and labels is not None:
            servable = records.read_servable_info(self.checkpoint) if found.servable else None
            self.info = ModelInfo.of(
                servable or ServableInfo(label_names=labels),  # a plain folder: its labels, TrainConfig's max_length
                checkpoint_format=found.kind,
                tokenizer=TokenizerSource("checkpoint", str(self.checkpoint)),
            )
            self.tokenizer = None  # no transformers tokenizer: the Rust one from tokenizer.json does the work
            self._init_common(labels, max_batch_size, problem_type=config.get("problem_type"))
            self.encoder = TextEncoder.from_tokenizer_json(self.checkpoint, self.max_length)
        else:
            graph = self._load_with_transformers(graph, max_batch_size, int8)
        assert graph is not None, "found, or made by _load_with_transformers"
        self.graph, self.spin = graph, spin
        self.onnx_path = graph.path if isinstance(graph, Graph) else graph
        source = self._source()
        self.session = self._session(threads, source)
        self._input_names = [i.name for i in self.session.get_inputs()]
        self.quantized = is_quantized_file(source) if isinstance(source, str) else has_quantized_ops(source)
        if int8:
            self.runtime = "onnx-int8"
            if not self.quantized:
                raise ValueError(
                    f"--runtime onnx-int8: {self.onnx_path} is not a quantized model "
                    "(make one with distrinews export --quantize int8)"
                )

    def _find_graph(self, onnx_model: str | os.PathLike[str] | Graph | None, name: str) -> Path | Graph | None:
        if onnx_model is not None:
            return onnx_model if isinstance(onnx_model, Graph) else Path(onnx_model)
        shipped = self.checkpoint / name
        return shipped if shipped.is_file() else DerivedFiles(self.checkpoint).read(name)

    def _source(self) -> str | bytes:
        """What a session is made from: a file's path, or the bytes of a cache entry, checked again as they are read."""
        return self.graph.read() if isinstance(self.graph, Graph) else str(self.graph)

    def _load_with_transformers(self, graph: Path | Graph | None, max_batch_size: int, int8: bool) -> Path | Graph:
        """A legacy ``.pt`` file, a step-N directory, or no ONNX file yet: load (and export) with torch."""
        from ..checkpoint.servable import load_for_inference

        # The tokenizer, labels and metadata from the checkpoint; the weights kept only to export a missing graph.
        model, self.tokenizer, self.info = load_for_inference(self.checkpoint)
        self._init_loaded(model, max_batch_size)
        if graph is None:
            graph = self._make_onnx(model, int8)
        del model
        return graph

    def _make_onnx(self, model: Any, int8: bool) -> Path | Graph:
        """The graph made from ``model`` and kept in the cache; where the cache cannot be written, in a temporary
        folder that lives as long as this predictor."""
        from .onnx import export_model, quantize_int8

        self._tmpdir = tempfile.TemporaryDirectory(prefix="distrinews-onnx-")
        tmp = Path(self._tmpdir.name)
        fp32 = self.checkpoint / FP32_FILE if self.checkpoint.is_dir() else tmp / "missing"
        if not fp32.is_file():
            fp32 = tmp / FP32_FILE
            log.info("no ONNX model for %s yet: exporting one", self.checkpoint)
            export_model(model, self.tokenizer, fp32)
        made = fp32
        if int8:
            log.info("quantizing %s to int8", fp32)
            made = quantize_int8(fp32, tmp / INT8_FILE)
        name = INT8_FILE if int8 else FP32_FILE
        try:
            graph = DerivedFiles(self.checkpoint).store(name, made.read_bytes())
        except OSError as exc:
            log.warning("%s could not be kept in the cache (%s): it is made again at the next start", name, exc)
            return made
        self._tmpdir.cleanup()
        self._tmpdir = None
        log.info("%s of %s kept in the cache: %s", name, self.checkpoint, graph.path)
        return graph

    def _session(self, threads: int | None, source: str | bytes) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if not self.spin:
            # Threads spin between the operators of a pass (waking a sleeping one per operator made a lone int8 pass
            # 1.4x as long: benchmarks/serving.md) and stop when the pass returns, rather than spin on for the next.
            options.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])

    def single_threaded(self) -> OnnxPredictor:
        """The same model, encoder and settings on a second session of one intra-op thread: passes on it run side by
        side, one a core, where this session's one pass at a time spreads over every core."""
        twin = copy.copy(self)
        twin.session = self._session(1, self._source())
        return twin

    def forward(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        (logits,) = self.session.run(["logits"], {name: inputs[name] for name in self._input_names})
        return np.asarray(logits, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "onnx_model": str(self.onnx_path),
            "onnx_quantized": self.quantized,
            "onnx_thread_spinning": self.spin,
        }

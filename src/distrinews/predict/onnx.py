"""Making the ONNX models the runtimes serve: the fp32 graph exported from a PyTorch classifier,
its int8 dynamic quantization, and how far either is from PyTorch.

The graph takes ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the tokenizer
makes them) with dynamic batch and sequence axes, and returns ``logits``, so the ONNX
predictor can pad each batch to its own longest text, exactly like the PyTorch one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from .sample import FIXED_SAMPLE

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OPSET = 17
# fp32 ONNX must reproduce PyTorch's probabilities to this tolerance (the contract).
FP32_PROB_TOLERANCE = 1e-3
# Texts of different lengths: tracing with real padding keeps the attention-mask path in the graph.
SAMPLE_TEXTS = list(FIXED_SAMPLE[:3])


class _LogitsOnly(torch.nn.Module):
    """Positional inputs in, a plain logits tensor out: the shape the tracer exports cleanly."""

    def __init__(self, model: torch.nn.Module, input_names: list[str]):
        super().__init__()
        self.model, self.input_names = model, input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(**dict(zip(self.input_names, inputs))).logits
        return logits


def export_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: str | os.PathLike[str]) -> Path:
    """Write ``model`` (eval mode, CPU) as fp32 ONNX to ``out``, atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").eval()
    enc = tokenizer(SAMPLE_TEXTS, padding=True, return_tensors="pt")
    input_names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    dynamic_axes = {**{name: {0: "batch", 1: "sequence"} for name in input_names}, "logits": {0: "batch"}}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    # Attention as plain MatMul/Softmax ("eager"): the SDPA graph the exporter writes otherwise carries NaN guards
    # and mask arithmetic that ONNX Runtime runs ~15% slower on a CPU, for the same probabilities.
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in (None, "eager") and hasattr(model, "set_attn_implementation"):
        cast("PreTrainedModel", model).set_attn_implementation("eager")
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        # The TorchScript exporter (dynamo=False): the torch.export-based default needs onnxscript and gives nothing
        # better for a static BERT graph; the tracer's Python-bool warnings concern branches the batch does not change.
        warnings.simplefilter("ignore")
        # .eval() on the wrapper too: the exporter restores the wrapper's own mode afterwards, and a fresh Module is
        # in training mode, which would switch the model's dropout on.
        torch.onnx.export(
            _LogitsOnly(model, input_names).eval(),
            tuple(enc[name] for name in input_names),
            str(tmp),
            input_names=input_names,
            output_names=["logits"],
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    model.eval()
    if attention not in (None, "eager") and hasattr(model, "set_attn_implementation"):
        cast("PreTrainedModel", model).set_attn_implementation(attention)
    os.replace(tmp, out)
    return out


def quantize_int8(fp32_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Dynamic int8 quantization of the weights of MatMul/Gemm (activations quantized at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.onnx")
    # Per-channel scales keep each output column's own range: cheap, and it holds the projections' accuracy.
    with _without_preprocessing_hint():
        quantize_dynamic(str(fp32_path), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
    os.replace(tmp, out)
    return out


def _drop_hint(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Please consider")


@contextlib.contextmanager
def _without_preprocessing_hint() -> Iterator[None]:
    """ONNX Runtime's "consider pre-processing before quantization" hint (about static quantization: the user of
    ``train`` cannot act on it) kept out of the run's summary. It goes through the root logger, whose first record
    would also install a stderr handler for the whole process: a NullHandler stands in while the quantizer runs."""
    root = logging.getLogger()
    stand_in = logging.NullHandler() if not root.handlers else None
    if stand_in is not None:
        root.addHandler(stand_in)
    root.addFilter(_drop_hint)
    try:
        yield
    finally:
        root.removeFilter(_drop_hint)
        if stand_in is not None:
            root.removeHandler(stand_in)


def compare_with_torch(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    onnx_path: str | os.PathLike[str],
    texts: list[str] | None = None,
    max_length: int = 128,
) -> dict[str, Any]:
    """Max |p_onnx - p_torch| and label agreement on ``texts`` (one padded batch)."""
    import onnxruntime as ort

    texts = texts or SAMPLE_TEXTS
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.inference_mode():
        p_torch = torch.softmax(model(**{k: enc[k] for k in names}).logits.float(), dim=-1)
    (logits,) = session.run(["logits"], {k: enc[k].numpy() for k in names})
    p_onnx = torch.softmax(torch.from_numpy(logits).float(), dim=-1)
    return {
        "max_abs_prob_diff": float((p_torch - p_onnx).abs().max()),
        "label_agreement": float((p_torch.argmax(-1) == p_onnx.argmax(-1)).float().mean()),
    }

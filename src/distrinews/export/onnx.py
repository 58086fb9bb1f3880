"""``distrinews export --format onnx [--quantize int8]``: a checkpoint's ONNX file beside it, checked
against PyTorch. The graph making itself is ``predict/onnx.py`` (the runtimes make it on demand too).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint.servable import load_for_inference
from ..predict.onnx import FP32_PROB_TOLERANCE, SAMPLE_TEXTS, compare_with_torch, export_model, is_quantized, quantize_int8

__all__ = ["FP32_PROB_TOLERANCE", "SAMPLE_TEXTS", "compare_with_torch", "export_model", "export_onnx", "is_quantized", "quantize_int8"]


def export_onnx(checkpoint: str | os.PathLike, out: str | os.PathLike, quantize: str | None = None) -> Path:
    """``distrinews export --format onnx [--quantize int8]``: write ``out`` and verify it against PyTorch.

    The fp32 graph must match PyTorch's probabilities within 1e-3 or the export fails; the
    int8 graph is not held to that (quantization moves probabilities by design) — its
    accuracy is measured on the test set instead (benchmarks/onnx-int8.md).
    """
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    model, tokenizer, info = load_for_inference(checkpoint)
    out = Path(out)
    max_length = info.max_length
    if quantize is None:
        export_model(model, tokenizer, out)
        check = compare_with_torch(model, tokenizer, out, max_length=max_length)
        if check["max_abs_prob_diff"] > FP32_PROB_TOLERANCE:
            out.unlink(missing_ok=True)
            raise RuntimeError(
                f"ONNX export of {checkpoint} disagrees with PyTorch: max |dp| = {check['max_abs_prob_diff']:.2e} > {FP32_PROB_TOLERANCE}"
            )
        return out
    fp32 = out.with_name(f".{out.stem}.fp32.{os.getpid()}.onnx")
    try:
        export_model(model, tokenizer, fp32)
        quantize_int8(fp32, out)
    finally:
        fp32.unlink(missing_ok=True)
    return out

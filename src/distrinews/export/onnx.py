"""``distrinews export --format onnx [--quantize int8]``: a checkpoint's ONNX file, checked against PyTorch, at
``--output``, else in the cache where the runtimes look for it (``predict/derived.py``; never into the checkpoint).
``predict/onnx.py`` makes the graphs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..checkpoint.servable import load_for_inference
from ..predict.derived import FP32_FILE, DerivedFiles
from ..predict.onnx import FP32_PROB_TOLERANCE, compare_with_torch, export_model


def export_onnx(
    checkpoint: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, quantize: str | None = None
) -> Path:
    """Write ``out`` (None: the cache entry the runtimes read), checked, and return where it is. The fp32 graph must
    give PyTorch's probabilities within 1e-3; the int8 graph (quantization moves probabilities by design) is checked
    against fp32 as ``--runtime auto`` checks it (``predict/int8.py``), the check in its metadata."""
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    model, tokenizer, info = load_for_inference(checkpoint)
    if quantize is None:
        with tempfile.TemporaryDirectory(prefix="distrinews-export-") as tmp:
            made = export_model(model, tokenizer, Path(out) if out is not None else Path(tmp) / FP32_FILE)
            check = compare_with_torch(model, tokenizer, made, max_length=info.max_length)
            if check["max_abs_prob_diff"] > FP32_PROB_TOLERANCE:
                made.unlink(missing_ok=True)
                raise RuntimeError(
                    f"ONNX export of {checkpoint} disagrees with PyTorch: max |dp| "
                    f"= {check['max_abs_prob_diff']:.2e} > {FP32_PROB_TOLERANCE}"
                )
            return made if out is not None else DerivedFiles(checkpoint).store(FP32_FILE, made.read_bytes()).path
    del model
    from ..predict.int8 import SERVE_CHECK_ROWS, labelled_rows, make_int8

    where, _check = make_int8(checkpoint, labelled_rows(info.training_config, SERVE_CHECK_ROWS, info.label_names), out)
    return where if isinstance(where, Path) else where.path

"""int8 quantization leaves ONNX Runtime's pre-processing hint out of the run's output (issue 49)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest


def _matmul_model(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 4])],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_no_preprocessing_hint_and_no_root_handler_left(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from distrinews.predict.onnx import quantize_int8
    from distrinews.predict.onnx_runtime import is_quantized_file

    model = _matmul_model(tmp_path / "model.onnx")
    root = logging.getLogger()
    # As in `distrinews train`: nothing configured the root logger, so ONNX Runtime's root-logger
    # warning would call logging.basicConfig() and print itself (pytest's own handlers are set aside).
    saved, root.handlers = root.handlers, []
    try:
        out = quantize_int8(model, tmp_path / "model.int8.onnx")
        left = list(root.handlers)
    finally:
        root.handlers = saved
    assert is_quantized_file(out)
    assert "pre-processing" not in capfd.readouterr().err
    assert left == []

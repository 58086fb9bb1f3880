"""benchmarks/tools/onnx_spinning.py: each session spins as its name says, and a round measures passes."""

from __future__ import annotations

import contextlib

import pytest

from benchmarks.tools import onnx_spinning
from conftest import require


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A graph that takes input_ids and attention_mask (not token_type_ids) and sums their product."""
    onnx = require("onnx")
    from onnx import TensorProto, helper

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])
    out = helper.make_tensor_value_info("logits", TensorProto.INT64, None)
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["m"]),
        helper.make_node("ReduceSum", ["m"], ["logits"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "sum", [ids, mask], [out]), opset_imports=[helper.make_opsetid("", 13)]
    )
    path = tmp_path_factory.mktemp("spin") / "sum.onnx"
    onnx.save(model, str(path))
    return str(path)


def _entries(sess) -> dict[str, str]:
    """The spinning settings the session was given (an unset one is ONNX Runtime's default)."""
    found = {}
    for key in ("session.intra_op.allow_spinning", "session.force_spinning_stop"):
        with contextlib.suppress(RuntimeError):  # "does not have configuration": unset
            found[key] = sess.get_session_options().get_session_config_entry(key)
    return found


def test_each_session_spins_as_named_and_a_round_times_its_passes(graph):
    sessions = {mode: onnx_spinning.session(graph, mode, threads=2) for mode in onnx_spinning.MODES}
    assert {mode: _entries(sess) for mode, sess in sessions.items()} == {
        "off": {"session.intra_op.allow_spinning": "0"},
        "on": {},
        "stop": {"session.force_spinning_stop": "1"},
    }
    inputs = onnx_spinning.feed(sessions["off"], tokens=7)
    assert sorted(inputs) == ["attention_mask", "input_ids"] and inputs["input_ids"].shape == (1, 7)
    ms, busy = onnx_spinning.one_round(sessions["stop"], inputs, passes=5, pause_s=0.0)
    assert ms > 0 and busy >= 0

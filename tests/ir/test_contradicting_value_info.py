"""A value_info entry that contradicts the tensor it names (onnxruntime's optimizer writes a
scale initializer of dims [1] with a scalar value_info; onnxruntime-genai's builder a
Constant [1] declared as a scalar): dropped at load, with a note, so ONNX shape inference
types everything downstream instead of stopping there.

Differential: eight runs on one input buffer whose contents change, against onnxruntime
(which takes the initializer's own shape too)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session

import workbench

SHAPE = (2, 4, 8)


def _model(declared_rank: int, source: str = "initializer"):
    """x * scale -> Softmax -> Mul(2) -> y, with scale [1] (an initializer, or a Constant
    node's value) declared by value_info as rank `declared_rank` (0 contradicts it, 1 agrees)."""
    scale = numpy_helper.from_array(np.array([0.25], np.float32), "scale")
    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             helper.make_node("Mul", ["probs", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    if source == "initializer":
        inits.append(scale)
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["scale"], value=scale))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
                              value_info=[helper.make_tensor_value_info("scale", TensorProto.FLOAT,
                                                                        [1] * declared_rank)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _runs(model):
    session = workbench.InferenceSession(model.SerializeToString())
    oracle = ort_session(model)
    rng = np.random.default_rng(3)
    x = np.empty(SHAPE, np.float32)
    for run in range(8):
        x[...] = rng.standard_normal(SHAPE) * (1 + run)
        want, = oracle.run(None, {"x": x.copy()})
        got, = session.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"run {run}")
    return session


@pytest.mark.parametrize("source", ["initializer", "constant"])
def test_a_value_info_contradicting_its_tensor_is_dropped_and_inference_goes_through(source):
    session = _runs(_model(declared_rank=0, source=source))
    notes = session.recording.rewrites().query("kept")
    assert notes.rule.tolist() == ["value_info_dropped"]
    assert "scale" in notes.result.iloc[0]
    values = session.graph.values
    for name in ("scaled", "probs", "y"):  # typed at load: inference no longer stops at the scale
        v = values[session.graph.by_name[name]]
        assert (v.dtype, v.shape) == (np.float32, SHAPE), name


@pytest.mark.parametrize("source", ["initializer", "constant"])
def test_a_value_info_agreeing_with_its_tensor_stays_without_a_note(source):
    session = _runs(_model(declared_rank=1, source=source))
    assert session.recording.rewrites().query("kept").empty

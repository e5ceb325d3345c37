"""Bare kernel calls run straight from the node loop (`executor.plain_call`): values,
trace rows and error reports as through the full dispatch.

Differential against onnxruntime, eager steps (capture off, so every node is
dispatched every step), inputs refilled in place between runs.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import SessionOptions
from workbench.errors import KernelError

RUNS = 8


def _model():
    rng = np.random.default_rng(41)
    w = numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Add", ["t", "x"], ["s"]),           # plain: two inputs
             helper.make_node("Unsqueeze", ["s", "axes"], ["u"]),  # a view: full dispatch
             helper.make_node("Mul", ["u", "u"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], [w, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("trace", [True, False])
def test_bare_kernel_calls_give_onnxruntimes_values_and_their_node_rows(trace):
    model = _model()
    session = workbench.InferenceSession(model, options=SessionOptions(capture=False, trace=trace))
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.empty((2, 6), np.float32)
    rng = np.random.default_rng(42)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        (got,) = session.run(None, {"x": x})
        (want,) = peer.run(None, {"x": x.copy()})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"run {run}")
    dispatch = session.executor.state.dispatch
    plain = {d.p.node.op_type for d in dispatch if d.plain is not None}
    assert {"MatMul", "Tanh", "Add", "Mul"} <= plain, plain
    assert "Unsqueeze" not in plain  # a view goes through the full dispatch
    in_place = {d.p.node.op_type for d in dispatch if d.alias is not None}
    assert {"Tanh", "Add"} <= in_place, in_place  # written over their dead inputs
    if trace:
        rows = session.recording.node_timings()
        assert len(rows) == RUNS * 6 and set(rows["mode"]) == {"eager"}
        assert (rows.groupby("step").plan_index.apply(list) == [list(range(6))] * RUNS).all()
        views = session.recording.views()
        assert len(views) == RUNS  # the Unsqueeze's view, once a step, among the node rows
        aliases = session.recording.aliases()
        assert len(aliases) == 2 * RUNS
        assert sorted(set(zip(aliases.value, aliases.into))) == [("s", "t"), ("t", "h")]


def test_a_failing_bare_call_is_reported_by_the_full_dispatch():
    """A kernel that raises on a bare call is retried without its preallocated outputs
    and then reported as the full dispatch does: the node and its inputs named."""
    model = _model()
    session = workbench.InferenceSession(model, options=SessionOptions(capture=False, trace=False))
    x = np.ones((2, 6), np.float32)
    session.run(None, {"x": x})
    tanh = next(p for p in session.plan.nodes if p.node.op_type == "Tanh")
    plain = next(d for d in session.executor.state.dispatch if d.p is tanh).plain
    assert plain is not None

    def broken(ins, outs):
        raise FloatingPointError("boom")

    # the prepared call holds the kernel it was given: swap it there, as in the node
    d = next(d for d in session.executor.state.dispatch if d.p is tanh)
    d.plain = (broken, *plain[1:])
    tanh.fn = broken
    with pytest.raises(KernelError, match=r"Tanh.*boom"):
        session.run(None, {"x": x})

"""Kernels that keep what they work out per shape (`ops.layout.shape_memo`) give the same
values as onnxruntime when the shapes they are asked for change from run to run and come
back: inputs refilled in place, 8 runs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import workbench
from workbench import SessionOptions


def test_expand_to_a_shape_read_at_run_time_follows_every_request():
    """Expand's target from a shape fed at run time, memoised per (input shape,
    requested shape): the requests alternate and repeat, the input is refilled in place."""
    node = helper.make_node("Expand", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "expand",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 4]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = workbench.InferenceSession(model, options=SessionOptions(capture=False))
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(51)
    x = np.empty((1, 1, 4), np.float32)
    shape = np.empty(3, np.int64)
    for run, target in enumerate([(3, 1, 4), (2, 5, 4), (3, 1, 4), (1, 1, 1), (2, 5, 4), (3, 2, 1), (3, 1, 4),
                                  (1, 6, 4)]):
        x[...] = rng.standard_normal(x.shape)
        shape[...] = target
        (got,) = ours.run(None, {"x": x, "shape": shape})
        (want,) = peer.run(None, {"x": x.copy(), "shape": shape.copy()})
        assert got.shape == want.shape, (run, target)
        np.testing.assert_array_equal(got, want, err_msg=f"run {run}")

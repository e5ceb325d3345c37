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


def test_expand_views_its_input_for_every_layout_and_dtype_vs_onnxruntime():
    """Expand's zero-copy view (numpy's constructor on the input's buffer, broadcast
    dims at stride 0) read by the next node: float32 and int64 inputs, a constant and
    a fed target, a transposed (non-contiguous) input that takes numpy's broadcast_to;
    8 runs, inputs refilled in place, against onnxruntime."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]),
             helper.make_node("Add", ["e", "bias"], ["y"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[2, 1, 0]),
             helper.make_node("Expand", ["xt", "fixed"], ["et"]),
             helper.make_node("Mul", ["et", "et"], ["z"]),
             helper.make_node("Expand", ["ids", "fixed"], ["w"])]
    graph = helper.make_graph(
        nodes, "expand_views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [5]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (("y", TensorProto.FLOAT), ("e", TensorProto.FLOAT),
                                                                 ("z", TensorProto.FLOAT), ("w", TensorProto.INT64))],
        [helper.make_tensor("fixed", TensorProto.INT64, [3], [2, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(52)
    feeds = {"x": np.empty((1, 3, 1), np.float32), "shape": np.empty(4, np.int64),
             "bias": np.empty(5, np.float32), "ids": np.empty((1, 3), np.int64)}
    for run, target in enumerate([(2, 1, 3, 5), (1, 1, 1, 5), (2, 1, 3, 5), (4, 2, 3, 5)] * 2):
        feeds["x"][...] = rng.standard_normal((1, 3, 1))
        feeds["bias"][...] = rng.standard_normal(5)
        feeds["ids"][...] = rng.integers(-9, 9, (1, 3))
        feeds["shape"][...] = target
        got = ours.run(None, feeds)
        want = peer.run(None, {k: v.copy() for k, v in feeds.items()})
        for name, g, w in zip(("y", "e", "z", "w"), got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (run, name)
            np.testing.assert_array_equal(g, w, err_msg=f"run {run}: {name}")


def test_unsqueeze_follows_a_growing_dim_with_axes_placed_once_per_rank():
    """Unsqueeze's output shape worked out per input rank (the 1s' positions), not per
    shape: a dim that grows every run (a decode's length), negative and unordered axes,
    a rank change; 8 runs, the input refilled, against onnxruntime."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axes_a"], ["a"]),
             helper.make_node("Unsqueeze", ["x", "axes_b"], ["b"]),
             helper.make_node("Add", ["a", "one"], ["c"])]
    graph = helper.make_graph(
        nodes, "unsqueeze",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b", "c")],
        [helper.make_tensor("axes_a", TensorProto.INT64, [2], [-1, 0]),
         helper.make_tensor("axes_b", TensorProto.INT64, [3], [3, 1, -5]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(53)
    for run in range(8):
        x = rng.standard_normal((2 + run % 2, 3 + run)).astype(np.float32)  # the length grows every run
        got = ours.run(None, {"x": x})
        want = peer.run(None, {"x": x.copy()})
        for name, g, w in zip("abc", got, want):
            assert g.shape == w.shape, (run, name, g.shape, w.shape)
            np.testing.assert_array_equal(g, w, err_msg=f"run {run}: {name}")


def test_expand_broadcast_shape_is_numpys_rule():
    """`layout._broadcast_shape`, numpy's broadcasting rule written out, against
    `np.broadcast_shapes` over every pair of shapes of rank <= 3 with dims 1-3 (and
    shapes with a zero dim): the same shape, or both refuse."""
    import itertools

    from workbench.ops.layout import _broadcast_shape

    shapes = [s for rank in range(4) for s in itertools.product((1, 2, 3), repeat=rank)]
    shapes += [(0,), (0, 3), (2, 0), (1, 0, 1)]
    for a, b in itertools.product(shapes, repeat=2):
        try:
            want = tuple(np.broadcast_shapes(a, b))
        except ValueError:
            want = None
        try:
            got = _broadcast_shape(a, list(b))
        except ValueError:
            got = None
        assert got == want, (a, b)

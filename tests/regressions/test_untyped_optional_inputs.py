"""An optional input whose value shape inference left untyped is still an input.

onnxruntime-genai's builder declares its shape constants' value_info with rank 0
although the Constant nodes make rank 1 tensors, so ONNX shape inference stops at the
first of them; a model edited to expose intermediate values as graph outputs (how one
compares a decode with onnxruntime value by value) declares those outputs without a
type. The values then reach the kernel builders with no dtype. Kernels used to read
"no dtype" as "omitted": ReduceSum summed every axis (SmolLM2's attention-mask
ReduceSum gave shape () for onnxruntime's (1,), no error), and Squeeze, Slice, Split,
Gemm and LayerNormalization took their no-such-input path. Presence is the input's
name (`NodeInfo.has_input`), never its dtype.

Each case feeds the optional input from a Constant whose declared type is wrong (as
genai's) and lists it as an untyped graph output; 6 runs with x refilled in place,
against onnxruntime and onnx.reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import workbench

RUNS = 6


def _constant(name: str, values: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(values, name + "_v"))


def _model(op: onnx.NodeProto, x_shape: tuple, optional: dict[str, np.ndarray], n_out: int = 1,
           initializers: tuple = ()) -> onnx.ModelProto:
    """`op` reading x and the Constant-made `optional` values, each declared rank 0 in
    value_info (shape inference fails) and exposed as an untyped graph output."""
    nodes = [_constant(name, v) for name, v in optional.items()] + [op]
    outputs = [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None) for k in range(n_out)]
    outputs += [helper.make_empty_tensor_value_info(name) for name in optional]
    wrong = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), [])
             for name, v in optional.items()]
    graph = helper.make_graph(nodes, "untyped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              outputs, list(initializers), value_info=wrong)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


CASES = {
    "ReduceSum axes": (helper.make_node("ReduceSum", ["x", "axes"], ["y0"], keepdims=0), (2, 16),
                       {"axes": _i64(1)}, 1, ()),
    "Squeeze axes": (helper.make_node("Squeeze", ["x", "axes"], ["y0"]), (2, 1, 4, 1), {"axes": _i64(1)}, 1, ()),
    "Slice axes and steps": (helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y0"]), (4, 10),
                             {"starts": _i64(1), "ends": _i64(9), "axes": _i64(1), "steps": _i64(3)}, 1, ()),
    "Split sizes": (helper.make_node("Split", ["x", "split"], ["y0", "y1"], axis=1), (2, 6),
                    {"split": _i64(2, 4)}, 2, ()),
    "Gemm C": (helper.make_node("Gemm", ["x", "b", "c"], ["y0"]), (3, 4), {"c": np.arange(5, dtype=np.float32)}, 1,
               (onnx.numpy_helper.from_array(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5), "b"),)),
    "LayerNormalization bias": (helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y0"]), (2, 8),
                                {"bias": np.linspace(-2, 2, 8, dtype=np.float32)}, 1,
                                (onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "scale"),)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_untyped_optional_input_is_read_not_taken_for_omitted(case):
    op, shape, optional, n_out, inits = CASES[case]
    model = _model(op, shape, optional, n_out, inits)
    data = model.SerializeToString()
    ours = workbench.InferenceSession(data)
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    reference = ReferenceEvaluator(model)
    names = [f"y{k}" for k in range(n_out)]
    rng = np.random.default_rng(11)
    x = np.empty(shape, np.float32)  # one array, refilled in place each run
    for run in range(RUNS):
        x[...] = rng.standard_normal(shape)
        got = ours.run(names, {"x": x})
        want = peer.run(names, {"x": x})
        expected = reference.run(names, {"x": x})
        for name, g, w, e in zip(names, got, want, expected):
            assert g.shape == w.shape == e.shape, f"{case} run {run} {name}: {g.shape} vs {w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{case} run {run} {name}")
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6, err_msg=f"{case} run {run} {name}")

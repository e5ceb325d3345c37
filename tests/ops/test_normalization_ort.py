"""Normalization kernels against onnxruntime on random inputs.

SimplifiedLayerNormalization is onnxruntime's op (default domain) and has no ONNX
node tests; LayerNormalization and RMSNormalization are checked here as well for
what the node tests do not cover: float16 inputs (statistics in float32) and the
optional statistics outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import workbench

ort = pytest.importorskip("onnxruntime")

F16, F32, F64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE
SHAPE = (2, 5, 16)


def _model(op: str, x_type: int, scale_type: int, outputs: list[tuple[str, int]],
           opset: int, bias: bool = False, **attrs):
    inputs = ["x", "scale"] + (["bias"] if bias else [])
    node = helper.make_node(op, inputs, [name for name, _ in outputs], **attrs)
    graph = helper.make_graph(
        [node], "norm",
        [helper.make_tensor_value_info("x", x_type, None),
         helper.make_tensor_value_info("scale", scale_type, None)]
        + ([helper.make_tensor_value_info("bias", scale_type, None)] if bias else []),
        [helper.make_tensor_value_info(name, et, None) for name, et in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _feed(x_type: int, scale_type: int, axis: int, bias: bool = False, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x_dtype = helper.tensor_dtype_to_np_dtype(x_type)
    scale_dtype = helper.tensor_dtype_to_np_dtype(scale_type)
    normalized_shape = SHAPE[axis:]
    feed = {
        "x": (rng.standard_normal(SHAPE) * 3 + 1).astype(x_dtype),
        "scale": rng.standard_normal(normalized_shape).astype(scale_dtype),
    }
    if bias:
        feed["bias"] = rng.standard_normal(normalized_shape).astype(scale_dtype)
    return feed


def _compare(model, feed: dict) -> None:
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feed)
    session = workbench.InferenceSession(model)
    got = session.run(None, feed)
    assert not session.fallback_nodes(), "ran on the onnx.reference fallback"
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g = np.asarray(g)
        assert g.dtype == e.dtype and g.shape == e.shape
        tol = 2e-3 if np.float16 in (g.dtype, feed["x"].dtype, feed["scale"].dtype) else 1e-5
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("x_type,scale_type", [
    (F32, F32), (F16, F16), (F64, F64), (F32, F16), (F16, F32),
], ids=["f32", "f16", "f64", "f32-scale-f16", "f16-scale-f32"])
@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
@pytest.mark.parametrize("with_inv_std", [False, True])
def test_simplified_layer_norm_matches_ort(x_type, scale_type, axis, with_inv_std):
    outputs = [("y", scale_type)] + ([("inv_std_var", F32)] if with_inv_std else [])
    model = _model("SimplifiedLayerNormalization", x_type, scale_type, outputs, opset=17,
                   axis=axis, epsilon=1e-6)
    _compare(model, _feed(x_type, scale_type, axis))


def test_simplified_layer_norm_default_attributes_and_large_half_values():
    # |x| > 256 squares past float16's range: the mean square must be taken in float32
    model = _model("SimplifiedLayerNormalization", F16, F16, [("y", F16), ("inv", F32)], opset=17)
    feed = _feed(F16, F16, -1)
    feed["x"] = (feed["x"] * 200).astype(np.float16)
    _compare(model, feed)


@pytest.mark.parametrize("x_type", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm_with_statistics_matches_ort(x_type, axis, bias):
    outputs = [("y", x_type), ("mean", F32), ("inv_std_dev", F32)]
    model = _model("LayerNormalization", x_type, x_type, outputs, opset=17, bias=bias,
                   axis=axis, epsilon=1e-5)
    _compare(model, _feed(x_type, x_type, axis, bias=bias))


@pytest.mark.parametrize("x_type", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm_matches_ort(x_type, axis):
    model = _model("RMSNormalization", x_type, x_type, [("y", x_type)], opset=23, axis=axis)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - older onnxruntime builds lack opset 23
        pytest.skip(f"onnxruntime cannot run RMSNormalization: {e}")
    _compare(model, _feed(x_type, x_type, axis))

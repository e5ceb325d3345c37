"""A decode step's float32 ``x @ W`` by a constant weight in the column-major layout
(`rewrite.matvec_layout`) runs compiled (`workbench.ops.matvec_jit`): within float32
rounding of onnxruntime's product (sums in another order, as BLAS's are), taken only
for one row, never where the model asks for onnxruntime's rounding.

Differential: eight runs with x one array refilled in place (and the planned output at
a stable address), against onnxruntime; two rows and a small weight take numpy's
product; `WORKBENCH_NUMBA=0` takes numpy's too.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench.ops import matvec_jit

RUNS = 8


def _model(rows: int, k: int, n: int, seed: int):
    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "W"], ["y"])
    graph = helper.make_graph([node], "matvec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _spy(monkeypatch) -> list:
    calls = []
    real = matvec_jit.product
    monkeypatch.setattr(matvec_jit, "product", lambda *a: calls.append(a[1].shape) or real(*a))
    return calls


@pytest.mark.parametrize(("rows", "k", "n", "compiled"), [
    (1, 576, 1536, True), (1, 1536, 576, True), (1, 576, 49152 // 8, True),  # SmolLM2's shapes
    (1, 333, 4099, True),  # rows not a multiple of the four a pass takes: the last three alone
    (2, 576, 1536, False),  # two rows: numpy's product
    (1, 64, 96, False),  # a small weight: numpy's product
])
def test_one_row_products_by_a_constant_weight_match_onnxruntime(rows, k, n, compiled, monkeypatch):
    assert matvec_jit.available()
    model = _model(rows, k, n, seed=k + n)
    calls = _spy(monkeypatch)
    ours = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    r = np.random.default_rng([rows, k, n])
    x = np.empty((1, rows, k), np.float32)
    for run in range(RUNS):
        x[...] = r.standard_normal(x.shape) * (10.0 ** (run % 3 - 1))
        want = peer.run(None, {"x": x.copy()})[0]
        got = ours.run(None, {"x": x})[0]
        assert got.shape == want.shape
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale, err_msg=f"run {run}")
    assert (len(calls) == RUNS) == compiled, calls


def test_numba_off_takes_numpys_product(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUMBA", "0")
    calls = _spy(monkeypatch)
    model = _model(1, 576, 1536, seed=1)
    ours = workbench.InferenceSession(model)
    x = np.random.default_rng(2).standard_normal((1, 1, 576)).astype(np.float32)
    w = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], x @ w, rtol=1e-5, atol=1e-5)
    assert not calls


def test_models_that_round_as_onnxruntime_keep_numpys_product(monkeypatch):
    calls = _spy(monkeypatch)
    model = _model(1, 576, 1536, seed=3)
    ours = workbench.InferenceSession(model, options=workbench.SessionOptions(onnxruntime_rounding="always"))
    ours.run(None, {"x": np.ones((1, 1, 576), np.float32)})
    assert not calls

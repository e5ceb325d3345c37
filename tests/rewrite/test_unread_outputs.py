"""The load-time rule `unread_output`: an optional output nothing reads is left out of
its node (no buffer, not computed), and the graph's outputs keep onnxruntime's values.

The idiom it is for: transformers' exporter after onnxruntime's CPU fusions names every
SkipSimplifiedLayerNormalization's mean and inverse-std outputs and reads neither; named,
they kept the kernel off its compiled one-row form.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import SessionOptions
from workbench.ops import mlas_jit

HIDDEN = 32


def _model():
    """SkipSimplifiedLayerNormalization (mean, inv_std unread; the sum read by an Add),
    then LayerNormalization (Mean unread, InvStdDev a graph output)."""
    rng = np.random.default_rng(3)
    gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "gamma")
    beta = numpy_helper.from_array(rng.uniform(-0.5, 0.5, HIDDEN).astype(np.float32), "beta")
    nodes = [
        helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["n", "mean", "inv", "sum"],
                         domain="com.microsoft", epsilon=1e-5, name="skip_norm"),
        helper.make_node("Add", ["n", "sum"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["y", "ln_mean", "ln_inv"], axis=-1,
                         epsilon=1e-5, name="layer_norm"),
    ]
    graph = helper.make_graph(
        nodes, "unread",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, HIDDEN]),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, 1, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, HIDDEN]),
         helper.make_tensor_value_info("ln_inv", TensorProto.FLOAT, [1, 1, 1])],
        [gamma, beta])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9)


def test_only_unread_optional_outputs_are_left_out():
    session = workbench.InferenceSession(_model().SerializeToString(), SessionOptions(trace=True))
    rows = session.recording.rewrites()
    rows = rows[rows.rule == "unread_output"]
    assert sorted(n for names in rows.original_nodes for n in names) == ["layer_norm", "skip_norm"]
    values = session.executor.graph.values
    outputs = {p.node.name: [values[v].name if v >= 0 else "" for v in p.outputs]
               for p in session.executor.plan.nodes}
    assert outputs["skip_norm"] == ["n", "", "", "sum"]  # the read sum stays
    assert outputs["layer_norm"] == ["y", "", "ln_inv"]  # a graph output stays
    disabled = workbench.InferenceSession(_model().SerializeToString(),
                                          SessionOptions(graph_optimization_level="disabled"))
    assert all(v >= 0 for p in disabled.executor.plan.nodes for v in p.outputs)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_values_match_onnxruntime_with_inputs_refilled_in_place(backend):
    proto = _model()
    oracle = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    session = workbench.InferenceSession(proto.SerializeToString(), backend=backend,
                                         options=SessionOptions(capture=True))
    be = session.backend
    rng = np.random.default_rng(5)
    hosts = {n: np.zeros((1, 1, HIDDEN), np.float32) for n in ("x", "skip")}
    device = {n: be.from_host(a) for n, a in hosts.items()}
    for run in range(8):
        for n, a in hosts.items():
            a[...] = rng.standard_normal(a.shape)
            be.copy_from_host(device[n], a)
        binding = session.io_binding()
        for n, a in device.items():
            binding.bind_input(n, a)
        for n in ("y", "ln_inv"):
            binding.bind_output(n)
        session.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()
        want = oracle.run(None, hosts)
        for name, g, w in zip(("y", "ln_inv"), got, want):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6, err_msg=f"{name} run {run}")


def test_the_skip_norm_takes_its_compiled_row_once_its_statistics_are_unread(monkeypatch):
    if not mlas_jit.available("skip_rms_row"):
        pytest.skip("numba's compiled rows are not available here")
    calls = []
    real = mlas_jit.skip_rms_row

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(mlas_jit, "skip_rms_row", counted)
    feeds = {"x": np.ones((1, 1, HIDDEN), np.float32), "skip": np.full((1, 1, HIDDEN), 0.5, np.float32)}
    ran = {}
    for level in ("disabled", "basic"):
        session = workbench.InferenceSession(_model().SerializeToString(),
                                             SessionOptions(capture=False, graph_optimization_level=level))
        calls.clear()  # (`mlas_jit.available` checks the kernel once, at the first build)
        session.run(None, feeds)
        ran[level] = len(calls)
    assert ran == {"disabled": 0, "basic": 1}, "named statistics keep the compiled row off; left out, it runs"

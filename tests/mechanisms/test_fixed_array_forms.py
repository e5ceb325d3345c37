"""Recorded launches call a kernel's fixed-arrays form: the kernel with its checks
of the arrays made once, when the launch is recorded, since every replay passes the
very same arrays. A mechanism like any other: it may change how the work is done,
never a value. The graph runs eight times with inputs at stable addresses and new
contents, each run checked against onnxruntime, and the test asserts that the
captured replays really went through the fixed-arrays forms."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor
from test_decode_speed_paths import _gqa_decode_model

import workbench
from workbench import SessionOptions
from workbench.ops import layer_norm_jit, mlas_jit
from workbench.ops.registry import fixed_arrays_kernel

RUNS = 8
HEADS, HEAD = 6, 16
WIDTH = HEADS * HEAD


def _attention_then_skip_norm():
    """x -> MatMul -> GroupQueryAttention (fixed shared cache) -> SkipSimplifiedLayerNormalization
    with the residual fed by the caller, its sum read by a Mul after it (so the sum is
    one of the executor's buffers, as a decoder's residual stream is) -> QuickGelu (the
    SiLU fusion's op) -> Add."""
    model, kv_shape, hidden = _gqa_decode_model(heads=HEADS, head=HEAD)
    g = model.graph
    gamma = np.random.default_rng(3).uniform(0.5, 1.5, WIDTH).astype(np.float32)
    g.initializer.append(numpy_helper.from_array(gamma, "gamma"))
    g.node.append(helper.make_node("SkipSimplifiedLayerNormalization", ["attn", "residual", "gamma"],
                                   ["normed", "", "", "residual_sum"], domain="com.microsoft", epsilon=1e-6))
    g.node.append(helper.make_node("Mul", ["normed", "residual_sum"], ["mixed"]))
    g.node.append(helper.make_node("QuickGelu", ["mixed"], ["gated"], domain="com.microsoft", alpha=1.0))
    g.node.append(helper.make_node("Add", ["gated", "residual_sum"], ["out"]))
    g.input.append(_tensor("residual", [1, 1, WIDTH]))
    g.output.append(_tensor("out", [1, 1, WIDTH]))
    return model, kv_shape, hidden


def _recorded_launches(session) -> list:
    graphs = session.executor.state.capture.graphs.values()
    return [fn for captured in graphs for fn, _, _ in captured.graph.launches]


def _node_fn(session, op_type):
    return next(p.fn for p in session.executor.plan.nodes if p.node.op_type == op_type)


def test_captured_replays_call_the_fixed_arrays_forms_and_match_onnxruntime():
    model, kv_shape, hidden = _attention_then_skip_norm()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(17)
    feeds = {"x": np.empty((1, 1, hidden), np.float32), "residual": np.empty((1, 1, WIDTH), np.float32),
             "past_key": np.zeros(kv_shape, np.float32), "past_value": np.zeros(kv_shape, np.float32),
             "seqlens_k": np.empty((1,), np.int32), "total_sequence_length": np.empty((), np.int32)}
    outputs = {"attn": np.empty((1, 1, WIDTH), np.float32), "out": np.empty((1, 1, WIDTH), np.float32),
               "present_key": feeds["past_key"], "present_value": feeds["past_value"]}
    binding = session.io_binding()
    for name, arr in feeds.items():
        binding.bind_input(name, arr)
    for name, arr in outputs.items():
        binding.bind_output(name, arr)
    ref_key, ref_value = feeds["past_key"].copy(), feeds["past_value"].copy()
    for run in range(RUNS):
        feeds["x"][...] = rng.standard_normal((1, 1, hidden))
        feeds["residual"][...] = rng.standard_normal((1, 1, WIDTH))
        feeds["seqlens_k"][...] = 2 + run
        feeds["total_sequence_length"][...] = 3 + run
        ort_feeds = {n: a.copy() for n, a in feeds.items()}
        ort_feeds["past_key"], ort_feeds["past_value"] = ref_key, ref_value
        want = dict(zip([o.name for o in oracle.get_outputs()], oracle.run(None, ort_feeds)))
        session.run_with_iobinding(binding)
        for name in ("attn", "out", "present_key", "present_value"):
            np.testing.assert_allclose(outputs[name], want[name], rtol=1e-5, atol=1e-5,
                                       err_msg=f"run {run}: {name}")
        ref_key, ref_value = want["present_key"], want["present_value"]
    events = session.recording.capture_events()
    assert (events.event == "replay").sum() >= RUNS - 4, "the captured replays must run for this to bite"
    forms = {fn.__qualname__ for fn in _recorded_launches(session) if "fixed_arrays_form" in fn.__qualname__}
    assert any(q.startswith("build_group_query_attention") for q in forms), forms
    assert any(q.startswith("_build_skip_norm") for q in forms), forms
    assert any(q.startswith("build_quick_gelu") for q in forms), forms


def test_a_kernel_offers_no_fixed_arrays_form_for_arrays_it_has_not_settled():
    """Other arrays than the ones the kernel last kept its checks for get the plain kernel."""
    model, kv_shape, hidden = _attention_then_skip_norm()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, capture=False))
    session.run(None, {"x": np.ones((1, 1, hidden), np.float32), "residual": np.ones((1, 1, WIDTH), np.float32),
                       "past_key": np.zeros(kv_shape, np.float32), "past_value": np.zeros(kv_shape, np.float32),
                       "seqlens_k": np.array([1], np.int32), "total_sequence_length": np.array(2, np.int32)})
    for op_type in ("GroupQueryAttention", "SkipSimplifiedLayerNormalization", "QuickGelu"):
        fn = _node_fn(session, op_type)
        assert hasattr(fn, "fixed_arrays_form"), op_type
        strangers = [np.zeros(3, np.float32)] * 9, [None] * 4  # QuickGelu: no output buffer
        assert fixed_arrays_kernel(fn, *strangers) is fn, op_type


def _two_rms_norms():
    """x -> MatMul -> SimplifiedLayerNormalization (Y and inv_std_var) -> RMSNormalization
    (opset 23) -> Add of the first norm's inv_std_var: both RMS norms on an executor's
    buffer, one with its statistics output read downstream."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    g1, g2 = (rng.uniform(0.5, 1.5, WIDTH).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("SimplifiedLayerNormalization", ["h", "g1"], ["y1", "inv1"], axis=-1, epsilon=1e-6),
         helper.make_node("RMSNormalization", ["y1", "g2"], ["y2"], axis=-1, epsilon=1e-5),
         helper.make_node("Add", ["y2", "inv1"], ["out"])],
        "two_rms_norms", [_tensor("x", [1, 1, WIDTH])], [_tensor("out", [1, 1, WIDTH])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (g1, "g1"), (g2, "g2"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def test_captured_rms_norms_call_their_fixed_arrays_form_and_match_onnxruntime():
    model = _two_rms_norms()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(23)
    x, out = np.empty((1, 1, WIDTH), np.float32), np.empty((1, 1, WIDTH), np.float32)
    binding = session.io_binding()
    binding.bind_input("x", x)
    binding.bind_output("out", out)
    for run in range(RUNS):
        x[...] = rng.standard_normal((1, 1, WIDTH)) * (1 + run)  # the scale moves inv_std_var too
        want, = oracle.run(None, {"x": x.copy()})
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
    events = session.recording.capture_events()
    assert (events.event == "replay").sum() >= RUNS - 4, "the captured replays must run for this to bite"
    forms = [fn.__qualname__ for fn in _recorded_launches(session)]
    assert [getattr(fn, "target", None) for fn in _recorded_launches(session)].count(mlas_jit.rms_rows) == 2, forms


def test_an_rms_norm_offers_no_fixed_arrays_form_where_its_outputs_do_not_fit():
    """No output buffer (a just-in-time sized Y) or a non-contiguous x: the plain kernel."""
    session = workbench.InferenceSession(_two_rms_norms(), SessionOptions(capture=False))
    session.run(None, {"x": np.ones((1, 1, WIDTH), np.float32)})
    fn = _node_fn(session, "SimplifiedLayerNormalization")
    gamma = np.ones(WIDTH, np.float32)
    x = np.ones((1, 1, WIDTH), np.float32)
    assert fixed_arrays_kernel(fn, [x, gamma], [None, None]) is fn
    strided = np.ones((1, 1, 2 * WIDTH), np.float32)[..., ::2]
    assert fixed_arrays_kernel(fn, [strided, gamma], [np.empty_like(x), np.empty((1, 1, 1), np.float32)]) is fn
    assert fixed_arrays_kernel(fn, [x, gamma], [np.empty_like(x), np.empty((1, 1, 1), np.float32)]) is not fn


def _layer_norms(axis=-1, width=WIDTH):
    """x -> MatMul -> LayerNormalization (scale, bias; over `axis`..end) -> SkipLayerNormalization
    (the caller's residual, gamma, beta and a bias; its sum read by an Add after it): GPT-2's
    norms on executor's buffers, compiled on the host."""
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    tail = [2, width // 2] if axis == -2 else [width]
    params = {"w": w, "scale": rng.uniform(0.5, 1.5, tail), "bias": rng.standard_normal(tail),
              "gamma": rng.uniform(0.5, 1.5, width), "beta": rng.standard_normal(width),
              "skip_bias": rng.standard_normal(width), "shape": np.array([1, 1, *tail], np.int64),
              "flat": np.array([1, 1, width], np.int64)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Reshape", ["h", "shape"], ["h_tail"]),
         helper.make_node("LayerNormalization", ["h_tail", "scale", "bias"], ["normed_tail"], axis=axis,
                          epsilon=1e-5),
         helper.make_node("Reshape", ["normed_tail", "flat"], ["normed"]),
         helper.make_node("SkipLayerNormalization", ["normed", "residual", "gamma", "beta", "skip_bias"],
                          ["y", "", "", "residual_sum"], domain="com.microsoft", epsilon=1e-5),
         helper.make_node("Add", ["y", "residual_sum"], ["out"])],
        "layer_norms", [_tensor("x", [1, 1, width]), _tensor("residual", [1, 1, width])],
        [_tensor("out", [1, 1, width])],
        [numpy_helper.from_array(a if a.dtype == np.int64 else a.astype(np.float32), n) for n, a in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


@pytest.mark.parametrize("capture", [True, False])
@pytest.mark.parametrize("axis", [-1, -2])
def test_compiled_layer_norms_match_onnxruntime_replayed_and_eager(capture, axis):
    """LayerNormalization and SkipLayerNormalization rows compiled (`layer_norm_jit`):
    replayed through their fixed-arrays forms, or dispatched each step; 8 runs on bound
    inputs refilled in place, each against onnxruntime."""
    model = _layer_norms(axis)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, capture=capture))
    oracle = _ort(model)
    rng = np.random.default_rng(29)
    x, residual = np.empty((1, 1, WIDTH), np.float32), np.empty((1, 1, WIDTH), np.float32)
    out = np.empty((1, 1, WIDTH), np.float32)
    binding = session.io_binding()
    binding.bind_input("x", x)
    binding.bind_input("residual", residual)
    binding.bind_output("out", out)
    for run in range(RUNS):
        x[...] = rng.standard_normal((1, 1, WIDTH)) * (1 + run)
        residual[...] = rng.standard_normal((1, 1, WIDTH)) + run
        want, = oracle.run(None, {"x": x.copy(), "residual": residual.copy()})
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    forms = [fn.__qualname__ for fn in _recorded_launches(session)]
    if capture:
        assert (session.recording.capture_events().event == "replay").sum() >= RUNS - 4
        assert any(getattr(fn, "target", None) is layer_norm_jit.layer_norm_rows
                   for fn in _recorded_launches(session)), forms
        assert any(q.startswith("_build_skip_norm.<locals>.fixed_arrays_form") for q in forms), forms
    else:
        assert not forms
        calls = []
        original = layer_norm_jit._kernels

        def counting():
            rows, skip_row = original()
            return (lambda *a: calls.append("rows") or rows(*a)), (lambda *a: calls.append("skip") or skip_row(*a))
        layer_norm_jit._kernels = counting
        try:
            session.run_with_iobinding(binding)
        finally:
            layer_norm_jit._kernels = original
        assert calls == ["rows", "skip"], "the eager kernels take the compiled rows"


def test_a_layer_norm_with_a_broadcast_scale_takes_the_generic_kernel_and_matches():
    """A scale of shape (1,) broadcasts: not the compiled rows' layout; the generic kernel,
    still onnxruntime's values."""
    model = _layer_norms()
    scale = next(i for i in model.graph.initializer if i.name == "scale")
    scale.CopyFrom(numpy_helper.from_array(np.array([1.25], np.float32), "scale"))
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    fn = _node_fn(session, "LayerNormalization")
    x = np.ones((1, 1, WIDTH), np.float32)
    assert fixed_arrays_kernel(fn, [x, np.array([1.25], np.float32), None], [np.empty_like(x)]) is fn
    rng = np.random.default_rng(2)
    oracle = _ort(model)
    for run in range(RUNS):
        feeds = {"x": rng.standard_normal((1, 1, WIDTH)).astype(np.float32),
                 "residual": rng.standard_normal((1, 1, WIDTH)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], oracle.run(None, feeds)[0], rtol=1e-5, atol=1e-5,
                                   err_msg=f"run {run}")


def test_with_numba_off_the_layer_norms_take_their_numpy_forms_and_match(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUMBA", "0")
    model = _layer_norms()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(31)
    x, residual = np.empty((1, 1, WIDTH), np.float32), np.empty((1, 1, WIDTH), np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal((1, 1, WIDTH))
        residual[...] = rng.standard_normal((1, 1, WIDTH))
        feeds = {"x": x, "residual": residual}
        np.testing.assert_allclose(session.run(None, feeds)[0], oracle.run(None, {k: v.copy() for k, v in feeds.items()})[0],
                                   rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    assert not any(hasattr(fn, "target") for fn in _recorded_launches(session))
    assert _node_fn(session, "LayerNormalization").__qualname__ == "build_layer_norm.<locals>.run"

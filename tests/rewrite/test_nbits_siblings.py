"""The load-time rule `nbits_siblings`: MatMulNBits nodes of one input (a layer's Q/K/V,
its MLP's gate and up, computed in int8 at accuracy_level 4) become one MatMulNBits over
the concatenated weights and a Split, and the values do not change: bit for bit the
unfused graph's, and onnxruntime's where `nbits_int8` is (MLAS's AVX512 path), over six
runs with A refilled in place at a stable address."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_matmulnbits_int8_compute import _mlas_avx512, _ort, _ulps, _weights
from test_quant_ops_ort import MS, OPSETS, REL_TOL
from test_quant_ops_ort import rng_for as _rng

import workbench
from workbench import SessionOptions
from workbench.rewrite import fusion

K = 96


def _siblings_model(widths, with_zp: bool, level: int = 4, block: int = 32):
    """A -> one MatMulNBits per width (its own weights) -> each output."""
    r = _rng("nbits_siblings", *widths, with_zp, level, block)
    nodes, inits, outputs = [], [], []
    for i, n in enumerate(widths):
        weights = _weights(r, K, n, 4, block, with_zp)
        names = ["A"]
        for key, value in weights.items():
            names.append(f"{key}{i}")
            inits.append(numpy_helper.from_array(value, f"{key}{i}"))
        nodes.append(helper.make_node("MatMulNBits", names, [f"Y{i}"], domain=MS, name=f"proj{i}", K=K, N=n,
                                      bits=4, block_size=block, accuracy_level=level))
        outputs.append(helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, [1, "M", n]))
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", K])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=OPSETS)


def _unfused(model):
    rules = list(fusion.RULES)
    fusion.RULES[:] = [rule for rule in rules if rule.__name__ != "fuse_sibling_nbits"]
    try:
        return workbench.InferenceSession(model)
    finally:
        fusion.RULES[:] = rules


@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("widths", [(64, 32, 32), (96, 96)])
def test_sibling_projections_fuse_and_every_value_stays_bit_for_bit(widths, with_zp):
    model = _siblings_model(widths, with_zp)
    fused = workbench.InferenceSession(model)
    rewrites = fused.recording.rewrites()
    assert (rewrites.rule == "nbits_siblings").sum() == 1
    assert sum(p.node.op_type == "MatMulNBits" for p in fused.executor.plan.nodes) == 1
    plain = _unfused(model)
    assert sum(p.node.op_type == "MatMulNBits" for p in plain.executor.plan.nodes) == len(widths)
    peer = _ort(model)
    exact = _mlas_avx512()
    r = np.random.default_rng(5)
    for m in (1, 3):
        a = np.zeros((1, m, K), np.float32)
        for run in range(6):
            a[...] = r.standard_normal(a.shape).astype(np.float32)  # the same array, new contents
            if run == 2:
                a[..., :32] = 0.0  # an all-zero block of A
            got = fused.run(None, {"A": a})
            base = plain.run(None, {"A": a})
            want = peer.run(None, {"A": a.copy()})
            for i, (g, b, w) in enumerate(zip(got, base, want)):
                np.testing.assert_array_equal(g, b, err_msg=f"M={m} run {run} Y{i}: fused != unfused")
                if exact:
                    assert _ulps(g, w) == 0, f"M={m} run {run} Y{i}: {_ulps(g, w)} ulps from onnxruntime"
                else:
                    bound = REL_TOL * max(1.0, float(np.abs(w).max()))
                    assert np.abs(g - w).max() <= bound


def test_projections_of_a_width_not_a_multiple_of_4_or_another_level_are_left():
    """MLAS sums the last N % 4 columns in another order; level 0 dequantizes at build
    time, cached only up to a size: neither is fused."""
    for model in (_siblings_model((64, 30), False), _siblings_model((64, 32), False, level=0)):
        session = workbench.InferenceSession(model)
        assert not (session.recording.rewrites().rule == "nbits_siblings").any()


def test_the_rule_runs_at_extended_and_all_only():
    model = _siblings_model((64, 32, 32), True)
    for level, fused in (("basic", False), ("extended", True), ("all", True)):
        session = workbench.InferenceSession(model, SessionOptions(graph_optimization_level=level))
        assert (session.recording.rewrites().rule == "nbits_siblings").any() == fused, level

"""Differential tests for rule ``identity_op`` (`rewrite.identity_ops`): Identity and a
Cast to its input's own dtype are removed, their readers rewired to the input.

Like every load-time rewrite it may change how a value is computed, never the value:
each graph runs eight times on one input buffer whose contents change, under the
default mechanisms, against onnxruntime running the loaded graph; each test asserts
what was removed and what had to stay (a dtype change, a graph output, a value a
subgraph captures)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor
from test_fusion_patterns import RUNS, _model, _ops, _rms_model, _rules

import workbench
from workbench import SessionOptions

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
SHAPE = (2, 3, 8)


def _differential(model, level="all", cond=None):
    """RUNS runs on a stable x buffer with new contents, every output against onnxruntime."""
    session = workbench.InferenceSession(model, SessionOptions(graph_optimization_level=level,
                                                               decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(7)
    feeds = {"x": np.empty(SHAPE, np.float32)}
    if cond is not None:
        feeds["cond"] = np.empty((), np.bool_)
    for run in range(RUNS):
        feeds["x"][...] = rng.standard_normal(SHAPE) * (1 + run)
        if cond is not None:
            feeds["cond"][...] = run % 2 == cond
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        got = session.run(None, feeds)
        for g, w, out in zip(got, want, oracle.get_outputs(), strict=True):
            assert g.dtype == w.dtype, f"run {run}: {out.name} dtype"
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"run {run}: {out.name}")
    return session


def _passes_model():
    """x -> Identity -> Cast(float) -> Cast(float) -> Neg -> Cast(float16) -> Cast(float) -> o1;
    Neg's output also through an Identity that is a graph output, and the cast chain's
    end added to x (o2)."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Cast", ["a"], ["b"], to=F32),
             helper.make_node("Cast", ["b"], ["c"], to=F32),
             helper.make_node("Neg", ["c"], ["n"]),
             helper.make_node("Cast", ["n"], ["h"], to=F16),
             helper.make_node("Cast", ["h"], ["o1"], to=F32),
             helper.make_node("Identity", ["n"], ["shown"]),
             helper.make_node("Add", ["c", "x"], ["o2"])]
    outputs = [_tensor("o1", list(SHAPE)), _tensor("shown", list(SHAPE)), _tensor("o2", list(SHAPE))]
    return _model(nodes, [_tensor("x", list(SHAPE))], outputs, [], 18)


@pytest.mark.parametrize("level", ["basic", "all"])
def test_identities_and_same_dtype_casts_removed_vs_onnxruntime(level):
    session = _differential(_passes_model(), level)
    removed = _rules(session, "identity_op")
    assert sorted(removed.original_ops.map(tuple)) == [("Cast",), ("Cast",), ("Identity",)]
    # kept: the float16 round trip (it rounds) and the Identity whose output the caller names
    assert [op for _, op in _ops(session)] == ["Neg", "Cast", "Cast", "Identity", "Add"]
    add = next(n for n in session.graph.nodes if n.op_type == "Add")
    assert [session.graph.values[v].name for v in add.inputs] == ["x", "x"], "rewired through the whole chain"


def test_a_float32_rms_norm_between_float32_casts_fuses_once_they_go():
    """torch.onnx's float32 RMS norm keeps its mixed-precision Casts (float to float): the
    casts go, and the chain between them is one SimplifiedLayerNormalization."""
    session = _differential(_rms_model(casts=True, dtype=F32))
    assert len(_rules(session, "identity_op")) == 2
    assert len(_rules(session, "rms_norm")) == 1
    assert [op for _, op in _ops(session)] == ["SimplifiedLayerNormalization", "Mul"]


def _captured_identity_model():
    """Identity(x) -> ix, read by both branches of an If: the then-branch through a
    Cast to float (its own, removable), the else-branch directly."""
    then_branch = helper.make_graph([helper.make_node("Cast", ["ix"], ["tc"], to=F32),
                                     helper.make_node("Neg", ["tc"], ["t"])], "then", [], [_tensor("t", list(SHAPE))])
    else_branch = helper.make_graph([helper.make_node("Abs", ["ix"], ["e"])], "else", [], [_tensor("e", list(SHAPE))])
    nodes = [helper.make_node("Identity", ["x"], ["ix"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Mul", ["y", "ix"], ["out"])]
    return _model(nodes, [_tensor("x", list(SHAPE)), _tensor("cond", [], TensorProto.BOOL)],
                  [_tensor("out", list(SHAPE))], [], 18)


def test_a_value_a_subgraph_captures_keeps_its_identity_and_a_body_cast_goes():
    session = _differential(_captured_identity_model(), cond=0)
    removed = _rules(session, "identity_op")
    assert removed.original_ops.map(tuple).tolist() == [("Cast",)], "the body's cast only"
    assert [op for _, op in _ops(session)] == ["Identity", "If", "Mul"]
    assert [n.op_type for n in session.graph.nodes[1].subgraphs["then_branch"].nodes] == ["Neg"]

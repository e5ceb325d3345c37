"""Differential tests for rule ``constant_folding`` inside If bodies (`rewrite.constant_folding.
fold_constants_in_bodies`): a body's Constant nodes, and what reads only them, become that
body's initializers at load instead of running every time the body runs.

Like every load-time rewrite it may change how a value is computed, never the value: each
graph runs eight times on one input buffer whose contents change, taking both branches in
turn, under the default mechanisms and with nothing rewritten, against onnxruntime running
the loaded graph; each test asserts what was folded and what had to stay (a body output, a
node reading the enclosing scope)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor
from test_fusion_patterns import RUNS, _model

import workbench
from workbench import SessionOptions

SHAPE = (2, 3, 8)


def _ints(name: str, values: list[int]):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _shape_chain(prefix: str) -> list:
    """A reshape target made of Constants the way optimum's exports make one: two scalar
    Constants, unsqueezed and concatenated into [6, 8]."""
    return [helper.make_node("Constant", [], [f"{prefix}_rows"], value=_ints(f"{prefix}_rows", [6])),
            helper.make_node("Constant", [], [f"{prefix}_axis"], value=_ints(f"{prefix}_axis", [0])),
            helper.make_node("Constant", [], [f"{prefix}_width"], value=numpy_helper.from_array(
                np.array(8, np.int64), f"{prefix}_width")),
            helper.make_node("Unsqueeze", [f"{prefix}_width", f"{prefix}_axis"], [f"{prefix}_width1"]),
            helper.make_node("Concat", [f"{prefix}_rows", f"{prefix}_width1"], [f"{prefix}_shape"], axis=0)]


def _if_model():
    """If(cond). then: x reshaped to [6, 8] by a Constant-made shape, plus a Constant
    that is also a body output (it must stay a node), times a nested If whose branches
    each hold a Constant. else: x times a Constant added to an outer value (`bias`, the
    enclosing graph's: a node reading it does not fold), reshaped by its own chain."""
    scale = helper.make_node("Constant", [], ["t_scale"], value=numpy_helper.from_array(
        np.array(1.5, np.float32), "t_scale"))
    shown = helper.make_node("Constant", [], ["t_shown"], value=numpy_helper.from_array(
        np.arange(4, dtype=np.float32), "t_shown"))
    inner = helper.make_node(
        "If", ["cond"], ["t_factor"],
        then_branch=helper.make_graph([helper.make_node("Constant", [], ["n_two"], value=numpy_helper.from_array(
            np.array(2.0, np.float32), "n_two"))], "inner_then", [], [_tensor("n_two", [])]),
        else_branch=helper.make_graph([helper.make_node("Constant", [], ["n_half"], value=numpy_helper.from_array(
            np.array(0.5, np.float32), "n_half"))], "inner_else", [], [_tensor("n_half", [])]))
    then_nodes = [*_shape_chain("t"), scale, shown, inner,
                  helper.make_node("Reshape", ["x", "t_shape"], ["t_flat"]),
                  helper.make_node("Mul", ["t_flat", "t_scale"], ["t_scaled"]),
                  helper.make_node("Mul", ["t_scaled", "t_factor"], ["t_y"])]
    else_nodes = [*_shape_chain("e"),
                  helper.make_node("Constant", [], ["e_three"], value=numpy_helper.from_array(
                      np.array(3.0, np.float32), "e_three")),
                  helper.make_node("Add", ["e_three", "bias"], ["e_offset"]),  # reads the outer scope
                  helper.make_node("Mul", ["x", "e_offset"], ["e_scaled"]),
                  helper.make_node("Reshape", ["e_scaled", "e_shape"], ["e_y"])]
    nodes = [helper.make_node("If", ["cond"], ["y", "shown"],
                              then_branch=helper.make_graph(then_nodes, "then", [],
                                                            [_tensor("t_y", [6, 8]), _tensor("t_shown", [4])]),
                              else_branch=helper.make_graph(else_nodes + [
                                  helper.make_node("Constant", [], ["e_shown"], value=numpy_helper.from_array(
                                      np.full(4, 7.0, np.float32), "e_shown"))], "else", [],
                                  [_tensor("e_y", [6, 8]), _tensor("e_shown", [4])]))]
    inits = [numpy_helper.from_array(np.array(0.25, np.float32), "bias")]
    return _model(nodes, [_tensor("x", list(SHAPE)), _tensor("cond", [], TensorProto.BOOL)],
                  [_tensor("y", [6, 8]), _tensor("shown", [4])], inits, 18)


def _differential(model, level: str):
    """RUNS runs on stable x and cond buffers with new contents (both branches in turn),
    every output against onnxruntime."""
    session = workbench.InferenceSession(model, SessionOptions(graph_optimization_level=level))
    oracle = _ort(model)
    rng = np.random.default_rng(11)
    feeds = {"x": np.empty(SHAPE, np.float32), "cond": np.empty((), np.bool_)}
    for run in range(RUNS):
        feeds["x"][...] = rng.standard_normal(SHAPE) * (1 + run)
        feeds["cond"][...] = run % 2 == 0
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        got = session.run(None, feeds)
        for g, w, out in zip(got, want, oracle.get_outputs(), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"run {run}: {out.name}")
    return session


def _body_ops(body) -> list[str]:
    return [n.op_type for n in body.nodes]


@pytest.mark.parametrize("level", ["basic", "all"])
def test_constants_inside_if_bodies_fold_at_load_vs_onnxruntime(level):
    session = _differential(_if_model(), level)
    rows = session.recording.rewrites()
    folded = set(rows[rows.rule == "constant_folding"].result)
    bodies = session.graph.nodes[0].subgraphs
    then, other = bodies["then_branch"], bodies["else_branch"]
    # each shape chain (three Constants, the Unsqueeze, the Concat) and the scalar
    # Constants became body initializers, the nested If's Constants are its branches'
    # outputs and stay nodes there, as does each body's Constant that is a body output
    assert folded == {"t_rows", "t_axis", "t_width", "t_width1", "t_shape", "t_scale",
                      "e_rows", "e_axis", "e_width", "e_width1", "e_shape", "e_three"}
    assert _body_ops(then) == ["Constant", "If", "Reshape", "Mul", "Mul"], "the body output's Constant stays"
    assert _body_ops(other) == ["Add", "Mul", "Reshape", "Constant"], "Add reads the outer bias: not folded"
    assert {then.values[v].name for v in then.initializers} == {"t_shape", "t_scale"}
    assert {other.values[v].name for v in other.initializers} == {"e_shape", "e_three"}
    inner = next(n for n in then.nodes if n.op_type == "If").subgraphs
    assert [_body_ops(b) for b in inner.values()] == [["Constant"], ["Constant"]]
    loaded = session.loaded_graph.nodes[0].subgraphs["then_branch"]
    assert len(loaded.nodes) == 11, "the loaded graph stays as it was"


def test_nothing_folds_inside_bodies_when_rewrites_are_off():
    session = _differential(_if_model(), "disabled")
    assert "constant_folding" not in set(session.recording.rewrites().rule)
    assert _body_ops(session.graph.nodes[0].subgraphs["then_branch"]).count("Constant") == 5

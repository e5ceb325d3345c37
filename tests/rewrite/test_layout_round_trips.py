"""Differential tests for rule ``layout_round_trip`` (`rewrite.layout_round_trips`): two
Reshapes in a row that end in the first one's input shape go, and two Transposes in a row
become one (or none).

Like every load-time rewrite it may change how a value is computed, never the value: each
graph runs eight times on stable input buffers whose contents change, against onnxruntime
running the loaded graph (`test_fusion_patterns._differential`); each test asserts what
was removed and what had to stay."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import tensor as _tensor
from test_fusion_patterns import _differential, _model, _ops, _rules

import workbench
from workbench import SessionOptions

HEADS, WIDTH = 4, 16
LENGTH = 5
SHAPES = {"q": (1, 1, HEADS, WIDTH), "k": (1, HEADS, LENGTH, WIDTH), "v": (1, HEADS, LENGTH, WIDTH)}


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _round_trip(x: str, prefix: str, before: list | None, after: list, split=(0, 0, HEADS, -1),
                allowzero: int = 0) -> list:
    """x -> [Transpose(before)] -> Reshape [0, 0, -1] (the heads merged) -> Reshape `split`
    -> Transpose(after): how onnxruntime's optimizer writes the attention it leaves unfused."""
    nodes, src = [], x
    if before is not None:
        nodes.append(helper.make_node("Transpose", [src], [f"{prefix}_t"], perm=before))
        src = f"{prefix}_t"
    nodes += [helper.make_node("Reshape", [src, "merge"], [f"{prefix}_merged"]),
              helper.make_node("Reshape", [f"{prefix}_merged", f"{prefix}_split"], [f"{prefix}_heads"],
                               allowzero=allowzero),
              helper.make_node("Transpose", [f"{prefix}_heads"], [f"{prefix}_out"], perm=after)]
    return nodes, _ints(f"{prefix}_split", list(split))


def _attention_model(*, k_split=(0, 0, HEADS, -1), allowzero=0, leak=False, length="length"):
    """softmax(Q K^T) V with Q, K and V each taken through a layout round trip (Q's
    Transpose puts the heads first, K's ends as K^T, V's is none at all). `leak`: K's
    merged value is also a graph output (it must stay)."""
    q_nodes, q_split = _round_trip("q", "q", None, [0, 2, 1, 3])
    k_nodes, k_split_init = _round_trip("k", "k", [0, 2, 1, 3], [0, 2, 3, 1], split=k_split, allowzero=allowzero)
    v_nodes, v_split = _round_trip("v", "v", [0, 2, 1, 3], [0, 2, 1, 3])
    nodes = [*q_nodes, *k_nodes, *v_nodes,
             helper.make_node("MatMul", ["q_out", "k_out"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v_out"], ["y"])]
    inits = [_ints("merge", [0, 0, -1]), q_split, k_split_init, v_split]
    inputs = [_tensor("q", [1, 1, HEADS, WIDTH]), _tensor("k", [1, HEADS, length, WIDTH]),
              _tensor("v", [1, HEADS, length, WIDTH])]
    outputs = [_tensor("y", [1, HEADS, 1, WIDTH])]
    if leak:
        outputs.append(_tensor("k_merged", [1, length, HEADS * WIDTH]))
    return _model(nodes, inputs, outputs, inits, 17)


def _transposes(session) -> list[list[int]]:
    return [list(n.attrs["perm"]) for n in session.graph.nodes if n.op_type == "Transpose"]


@pytest.mark.parametrize("length", ["length", LENGTH], ids=["symbolic", "static"])
def test_round_trips_removed_vs_onnxruntime(length):
    session = _differential(_attention_model(length=length), SHAPES)
    removed = _rules(session, "layout_round_trip")
    # three Reshape pairs; K's and V's Transpose pairs (V's permutes nothing)
    assert sorted(removed.original_ops.map(tuple)) == [("Reshape", "Reshape")] * 3 + [("Transpose", "Transpose")] * 2
    assert [op for _, op in _ops(session)] == ["Transpose", "Transpose", "MatMul", "Softmax", "MatMul"]
    assert _transposes(session) == [[0, 2, 1, 3], [0, 1, 3, 2]], "Q's heads first; K^T"
    second = session.graph.nodes[-1]
    assert session.graph.values[second.inputs[1]].name == "v", "V's round trip was no trip at all"


def _pair_model(first, second, *, leak=False):
    """x [1, length, 4, 16] -> Reshape `first` -> Reshape `second` -> Neg -> y (`leak`: the
    first Reshape's value is a graph output too)."""
    nodes = [helper.make_node("Reshape", ["x", "first"], ["middle"]),
             helper.make_node("Reshape", ["middle", "second"], ["back"]),
             helper.make_node("Neg", ["back"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if leak:
        outputs.append(helper.make_tensor_value_info("middle", TensorProto.FLOAT, None))
    return _model(nodes, [_tensor("x", [1, "length", HEADS, WIDTH])], outputs,
                  [_ints("first", first), _ints("second", second)], 17)


@pytest.mark.parametrize("first, second, leak", [
    ([0, 0, -1], [0, 0, 2 * HEADS, -1], False),  # another split of the heads: not x's shape
    ([0, 0, -1], [0, 0, HEADS, -1], True),  # the merged value is read elsewhere (a graph output)
    ([-1], [1, -1, HEADS, WIDTH], False),  # x's shape again, but the -1 keeps the symbol: not proven
], ids=["other split", "read elsewhere", "symbol in -1"])
def test_what_is_not_proven_to_restore_its_input_stays(first, second, leak):
    session = _differential(_pair_model(first, second, leak=leak), {"x": (1, LENGTH, HEADS, WIDTH)})
    assert _rules(session, "layout_round_trip").empty
    assert [op for _, op in _ops(session)] == ["Reshape", "Reshape", "Neg"]


def test_a_pair_that_restores_its_input_goes():
    session = _differential(_pair_model([0, 0, -1], [0, 0, HEADS, -1]), {"x": (1, LENGTH, HEADS, WIDTH)})
    assert len(_rules(session, "layout_round_trip")) == 1
    assert [op for _, op in _ops(session)] == ["Neg"]


def test_only_at_the_fusion_levels():
    model = _attention_model()
    session = workbench.InferenceSession(model, SessionOptions(graph_optimization_level="basic"))
    assert _rules(session, "layout_round_trip").empty
    assert [op for _, op in _ops(session)].count("Reshape") == 6

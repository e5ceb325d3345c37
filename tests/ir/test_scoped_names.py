"""Subgraph value names are scoped per graph: two If branches that name different
values alike (optimum's merged decoder: two decoders in one If) each get their own
shapes from ONNX inference, whose data propagation keys values by name across the
whole model (`workbench.ir.scoped_names`)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench.ir.loader import prepare
from workbench.ir.scoped_names import restore_names, scope_names


def _const(name, v): return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v), name))

def _branch(kind):
    # both branches name their values alike: s (a shape), ones (its ConstantOfShape), eq
    if kind == "then":
        nodes = [_const("tshape", np.array([1, 1, 2, 2], np.int64)),
                 helper.make_node("Reshape", ["x", "tshape"], ["t"]),
                 helper.make_node("Shape", ["t"], ["s"])]
    else:
        nodes = [_const("flat", np.array([-1], np.int64)),
                 helper.make_node("Reshape", ["x", "flat"], ["t"]),
                 helper.make_node("Shape", ["t"], ["s"])]
    nodes += [helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
              helper.make_node("Equal", ["t", "ones"], ["eq"]),
              helper.make_node("Cast", ["eq"], ["eqf"], to=TensorProto.FLOAT),
              helper.make_node("Add", ["eqf", "t"], ["sum"]),
              _const("back", np.array([4], np.int64)),
              helper.make_node("Reshape", ["sum", "back"], ["y_" + kind])]
    return helper.make_graph(nodes, kind, [], [helper.make_tensor_value_info("y_" + kind, TensorProto.FLOAT, [4])])

def g_model():
    return helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then"), else_branch=_branch("else"))], "m",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])


def _model() -> onnx.ModelProto:
    return helper.make_model(g_model(), opset_imports=[helper.make_opsetid("", 17)])


def test_branches_that_name_values_alike_each_run_with_their_own_shapes():
    """The else branch's `ones` (ConstantOfShape of a 1-D tensor's shape) was inferred
    4-D, the then branch's, and the branch runner preallocated it so: a KernelError
    here, a silent broadcast where the kernel's out= accepted the bigger buffer.
    Both branches, alternately, 8 runs on one pair of input arrays, vs onnxruntime."""
    model = _model()
    session = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cond, x = np.zeros((), np.bool_), np.zeros(4, np.float32)
    for run in range(8):
        cond[...] = run % 2 == 0
        x[...] = np.array([1, 0, 1, 2], np.float32) * (run % 3)
        got = session.run(None, {"cond": cond, "x": x})[0]
        want = peer.run(None, {"cond": cond.copy(), "x": x.copy()})[0]
        np.testing.assert_array_equal(got, want, err_msg=f"run {run}")


def test_scoping_changes_no_name_a_user_sees():
    model = _model()
    before = model.SerializeToString()
    restores = scope_names(model)
    assert restores is not None and any(restores)
    renamed = {o for n in model.graph.node[0].attribute[0].g.node for o in n.output}
    assert any("__wb_scope" in name for name in renamed)
    restore_names(model, restores)
    assert model.SerializeToString() == before
    inferred = prepare(_model())
    names = {vi.name for a in inferred.graph.node[0].attribute for vi in a.g.value_info}
    assert names and not any("__wb_scope" in n for n in names), names
    assert {"s", "ones", "eq"} <= names


def test_a_model_without_clashing_names_is_left_alone():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    assert scope_names(model) is None

"""Differential tests for the elementwise fusion rules (`rewrite.fusion_patterns`).

A fusion changes how a value is computed, never the value: every pattern (in the
forms exporters write it) runs at least six times on one input buffer whose contents
change, under the default mechanisms (memo, capture, views, level "all"), each run
compared with onnxruntime running the unfused graph (its own fusions off); each test
asserts the rewrite happened, and a value read outside the chain (or a changed
constant, axis or dtype) must leave the chain alone. The builders' models are checked
the same way, and greedy decode must give onnxruntime's tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor

import workbench
from workbench import SessionOptions, models

RUNS = 8
F32 = TensorProto.FLOAT


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _model(nodes, inputs, outputs, inits, opset, ms=False):
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = helper.make_graph(nodes, "pattern", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10 if opset >= 21 else 8)


def _rules(session, rule):
    return session.recording.rewrites().query(f"rule == {rule!r}")


def _differential(model, shapes, *, rtol=1e-5, atol=1e-5, dtypes=None, scale=2.0, seed=0):
    """Run `model` RUNS times on stable input buffers with new contents; every output
    against onnxruntime. Returns the session."""
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(seed)
    dtypes = dtypes or {}
    buffers = {name: np.empty(shape, dtypes.get(name, np.float32)) for name, shape in shapes.items()}
    names = [o.name for o in oracle.get_outputs()]
    for run in range(RUNS):
        for buf in buffers.values():
            buf[...] = (run % 3 == 1) if buf.dtype == np.bool_ else rng.standard_normal(buf.shape) * scale
        want = oracle.run(None, {k: v.copy() for k, v in buffers.items()})
        got = session.run(None, buffers)
        for g, w, name in zip(got, want, names, strict=True):
            assert g.dtype == w.dtype, f"run {run}: {name} dtype"
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol,
                                       err_msg=f"run {run}: {name}")
    return session


def _ops(session):
    return [(n.domain, n.op_type) for n in session.graph.nodes]


# --- RMSNorm -----------------------------------------------------------------------


def _rms_model(*, form="torch", opset=18, eps=1e-6, extra_reader=None, axis=-1, dtype=F32, casts=False,
               keep_cast=False, eps_outside=False):
    """x [2, 3, 8] -> RMSNorm -> y (times a second output, so y is not only a graph output).

    form "torch": Pow(2), Div(1, Sqrt), Mul(x, r), Mul(w, y);
    "reciprocal": Mul(x, x), Reciprocal, Mul(r, x), Mul(y, w);
    "div": Pow(2), Div(x, Sqrt), Mul(y, w).
    `extra_reader` names an intermediate that also becomes a graph output."""
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    x = "x"
    nodes = []
    if casts:
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], to=F32))
        x = "x32"
    if form == "reciprocal":
        nodes.append(helper.make_node("Mul", [x, x], ["sq"]))
    else:
        nodes.append(helper.make_node("Pow", [x, "two"], ["sq"]))
    if opset >= 18:
        nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["var"], axes=[axis], keepdims=1))
    if eps_outside:
        nodes += [helper.make_node("Sqrt", ["var"], ["root0"]), helper.make_node("Add", ["root0", "eps"], ["root"])]
    else:
        nodes += [helper.make_node("Add", ["var", "eps"], ["var_eps"]), helper.make_node("Sqrt", ["var_eps"], ["root"])]
    if form == "torch":
        nodes += [helper.make_node("Div", ["one", "root"], ["inv"]), helper.make_node("Mul", [x, "inv"], ["normed"])]
    elif form == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["root"], ["inv"]), helper.make_node("Mul", ["inv", x], ["normed"])]
    else:
        nodes.append(helper.make_node("Div", [x, "root"], ["normed"]))
    normed = "normed"
    if casts:
        nodes.append(helper.make_node("Cast", ["normed"], ["normed16"], to=dtype))
        normed = "normed16"
    if form == "torch":
        nodes.append(helper.make_node("Mul", ["w", normed], ["y"]))
    else:
        nodes.append(helper.make_node("Mul", [normed, "w"], ["y"]))
    nodes.append(helper.make_node("Mul", ["y", "y"], ["y2"]))
    outputs = [_tensor("y", [2, 3, 8], dtype), _tensor("y2", [2, 3, 8], dtype)]
    if keep_cast:
        nodes.append(helper.make_node("Neg", ["x32"], ["neg"]))
        outputs.append(_tensor("neg", [2, 3, 8]))
    if extra_reader:
        outputs.append(helper.make_empty_tensor_value_info(extra_reader))
    rng = np.random.default_rng(1)
    chain_dtype = np.float32 if casts else np_dtype
    inits = [_const("two", 2.0, chain_dtype), _const("eps", eps, chain_dtype), _const("one", 1.0, chain_dtype),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(8)).astype(np_dtype), "w"),
             numpy_helper.from_array(np.array([axis], np.int64), "axes")]
    return _model(nodes, [_tensor("x", [2, 3, 8], dtype)], outputs, inits, opset)


@pytest.mark.parametrize("form", ["torch", "reciprocal", "div"])
@pytest.mark.parametrize("opset", [13, 18])
def test_rms_norm_fused_vs_onnxruntime(form, opset):
    session = _differential(_rms_model(form=form, opset=opset), {"x": (2, 3, 8)})
    fused = _rules(session, "rms_norm")
    assert len(fused) == 1 and fused.nodes_saved.iloc[0] == {"torch": 6, "reciprocal": 6, "div": 5}[form]
    assert ("", "SimplifiedLayerNormalization") in _ops(session)
    assert not {"Pow", "ReduceMean", "Sqrt"} & {op for _, op in _ops(session)}
    node = next(n for n in session.graph.nodes if n.op_type == "SimplifiedLayerNormalization")
    assert node.attrs["axis"] == -1 and node.attrs["epsilon"] == pytest.approx(1e-6, rel=1e-6)


def test_rms_norm_last_axis_spelled_positively_is_fused():
    session = _differential(_rms_model(opset=13, axis=2), {"x": (2, 3, 8)})
    assert len(_rules(session, "rms_norm")) == 1


def test_rms_norm_mixed_precision_casts_fused_vs_onnxruntime():
    """float16 x, statistics in float32, cast back before the float16 weight: one
    SimplifiedLayerNormalization on the float16 x (float32 inside, rounded once)."""
    model = _rms_model(casts=True, dtype=TensorProto.FLOAT16)
    session = _differential(model, {"x": (2, 3, 8)}, dtypes={"x": np.float16}, rtol=2e-3, atol=2e-3)
    fused = _rules(session, "rms_norm")
    assert len(fused) == 1 and list(fused.original_ops.iloc[0])[0] == "Cast" and fused.nodes_saved.iloc[0] == 8
    assert not any(op == "Cast" for _, op in _ops(session))


def test_rms_norm_mixed_precision_keeps_a_cast_read_elsewhere():
    model = _rms_model(casts=True, dtype=TensorProto.FLOAT16, keep_cast=True)
    session = _differential(model, {"x": (2, 3, 8)}, dtypes={"x": np.float16}, rtol=2e-3, atol=2e-3)
    assert len(_rules(session, "rms_norm")) == 1
    assert [op for _, op in _ops(session)].count("Cast") == 1


@pytest.mark.parametrize("reader", ["sq", "var", "var_eps", "root", "inv", "normed"])
def test_rms_norm_blocked_by_a_reader_outside_the_chain(reader):
    session = _differential(_rms_model(extra_reader=reader), {"x": (2, 3, 8)})
    assert _rules(session, "rms_norm").empty


@pytest.mark.parametrize("case", ["eps_outside_sqrt", "not_last_axis", "float16_without_casts"])
def test_rms_norm_not_fused_when_not_equivalent(case):
    kwargs = {"eps_outside_sqrt": {"eps_outside": True}, "not_last_axis": {"axis": 1, "opset": 13},
              "float16_without_casts": {"dtype": TensorProto.FLOAT16}}[case]
    dtypes = {"x": np.float16} if case.startswith("float16") else None
    tol = 1e-2 if dtypes else 1e-5  # float16 op by op: both sides round each step
    session = _differential(_rms_model(**kwargs), {"x": (2, 3, 8)}, dtypes=dtypes, rtol=tol, atol=tol)
    assert _rules(session, "rms_norm").empty


# --- SiLU --------------------------------------------------------------------------


def _silu_model(*, swap=False, extra_reader=False, other_x=False):
    mul_in = ["s", "x"] if swap else ["x", "s"]
    if other_x:
        mul_in = ["z", "s"]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", mul_in, ["y"]),
             helper.make_node("Add", ["y", "y"], ["out"])]
    inputs = [_tensor("x", [3, 16]), _tensor("z", [3, 16])]
    outputs = [_tensor("out", [3, 16])] + ([_tensor("s", [3, 16])] if extra_reader else [])
    return _model(nodes, inputs, outputs, [], 17)


@pytest.mark.parametrize("swap", [False, True])
def test_silu_fused_vs_onnxruntime(swap):
    session = _differential(_silu_model(swap=swap), {"x": (3, 16), "z": (3, 16)}, scale=6.0)
    fused = _rules(session, "silu")
    assert len(fused) == 1 and list(fused.original_ops.iloc[0]) == ["Sigmoid", "Mul"]
    node = next(n for n in session.graph.nodes if n.op_type == "QuickGelu")
    assert node.domain == "com.microsoft" and node.attrs["alpha"] == 1.0


@pytest.mark.parametrize("case", ["sigmoid_read_elsewhere", "mul_of_another_value"])
def test_silu_not_fused(case):
    model = _silu_model(extra_reader=case == "sigmoid_read_elsewhere", other_x=case == "mul_of_another_value")
    session = _differential(model, {"x": (3, 16), "z": (3, 16)}, scale=6.0)
    assert _rules(session, "silu").empty
    assert ("", "Sigmoid") in _ops(session)


# --- GELU --------------------------------------------------------------------------


def _gelu_model(*, form="erf_div", tail="x_then_half", opset=17, extra_reader=None, half=0.5):
    """x [4, 12] -> GELU -> y -> Neg. `form`: "erf_div" (x / sqrt 2), "erf_mul" (x * 1/sqrt 2)
    or "tanh"; `tail` how x and 0.5 multiply (1 + erf): "x_then_half" Mul(Mul(x, t), 0.5),
    "half_x_first" Mul(Mul(x, 0.5), t), "half_then_x" Mul(Mul(t, 0.5), x)."""
    inits = [_const("one", 1.0), _const("half", half)]
    nodes = []
    if form == "erf_div":
        nodes.append(helper.make_node("Div", ["x", "sqrt2"], ["scaled"]))
        inits.append(_const("sqrt2", math.sqrt(2.0)))
    elif form == "erf_mul":
        nodes.append(helper.make_node("Mul", ["inv_sqrt2", "x"], ["scaled"]))
        inits.append(_const("inv_sqrt2", 1 / math.sqrt(2.0)))
    if form.startswith("erf"):
        nodes.append(helper.make_node("Erf", ["scaled"], ["e"]))
    else:
        nodes += [helper.make_node("Pow", ["x", "three"], ["cube"]),
                  helper.make_node("Mul", ["cube", "cubic"], ["cube_c"]),
                  helper.make_node("Add", ["x", "cube_c"], ["inner"]),
                  helper.make_node("Mul", ["inner", "k"], ["scaled"]),
                  helper.make_node("Tanh", ["scaled"], ["e"])]
        inits += [_const("three", 3.0), _const("cubic", 0.044715), _const("k", math.sqrt(2 / math.pi))]
    nodes.append(helper.make_node("Add", ["e", "one"], ["t"]))
    if tail == "x_then_half":
        nodes += [helper.make_node("Mul", ["x", "t"], ["xt"]), helper.make_node("Mul", ["xt", "half"], ["y"])]
    elif tail == "half_x_first":
        nodes += [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "t"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["t", "half"], ["th"]), helper.make_node("Mul", ["th", "x"], ["y"])]
    nodes.append(helper.make_node("Neg", ["y"], ["out"]))
    outputs = [_tensor("out", [4, 12])]
    if extra_reader:
        outputs.append(helper.make_empty_tensor_value_info(extra_reader))
    return _model(nodes, [_tensor("x", [4, 12])], outputs, inits, opset)


@pytest.mark.parametrize("tail", ["x_then_half", "half_x_first", "half_then_x"])
@pytest.mark.parametrize("form", ["erf_div", "erf_mul", "tanh"])
@pytest.mark.parametrize("opset", [17, 20])
def test_gelu_fused_vs_onnxruntime(form, tail, opset):
    session = _differential(_gelu_model(form=form, tail=tail, opset=opset), {"x": (4, 12)}, scale=3.0)
    fused = _rules(session, "gelu")
    assert len(fused) == 1 and fused.nodes_saved.iloc[0] == (4 if form.startswith("erf") else 7)
    want = {20: ("", "Gelu"), 17: ("com.microsoft", "FastGelu" if form == "tanh" else "Gelu")}[opset]
    assert want in _ops(session) and len(session.graph.nodes) == 2
    if opset == 20:
        node = next(n for n in session.graph.nodes if n.op_type == "Gelu")
        assert node.attrs["approximate"] == ("tanh" if form == "tanh" else "none")


@pytest.mark.parametrize("reader", ["scaled", "e", "t", "xt"])
def test_gelu_blocked_by_a_reader_outside_the_chain(reader):
    session = _differential(_gelu_model(extra_reader=reader), {"x": (4, 12)}, scale=3.0)
    assert _rules(session, "gelu").empty and ("", "Erf") in _ops(session)


def test_gelu_tanh_blocked_by_a_reader_of_the_cube():
    session = _differential(_gelu_model(form="tanh", extra_reader="cube"), {"x": (4, 12)}, scale=3.0)
    assert _rules(session, "gelu").empty


def test_gelu_not_fused_with_another_constant():
    session = _differential(_gelu_model(half=0.25), {"x": (4, 12)}, scale=3.0)
    assert _rules(session, "gelu").empty


def test_gelu_not_fused_when_its_constants_broadcast_a_0d_x():
    """x is 0-d and the constants have shape (1,): the chain's result has shape (1,),
    which Gelu(x) would not."""
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["scaled"]), helper.make_node("Erf", ["scaled"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["t"]), helper.make_node("Mul", ["x", "t"], ["xt"]),
             helper.make_node("Mul", ["xt", "half"], ["y"])]
    inits = [_const("sqrt2", [math.sqrt(2.0)]), _const("one", [1.0]), _const("half", [0.5])]
    model = _model(nodes, [_tensor("x", [])], [_tensor("y", [1])], inits, 20)
    session = _differential(model, {"x": ()})
    assert _rules(session, "gelu").empty


def test_contrib_gelu_kernel_vs_onnxruntime():
    """com.microsoft Gelu (the kernel the erf rule uses below opset 20) on its own."""
    nodes = [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")]
    model = _model(nodes, [_tensor("x", [5, 7])], [_tensor("y", [5, 7])], [], 17, ms=True)
    _differential(model, {"x": (5, 7)}, scale=4.0)


# --- LayerNormalization ------------------------------------------------------------


def _layer_norm_model(*, opset=17, bias=True, extra_reader=None, square="pow"):
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1) if opset < 18 else
             helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else
             helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1) if opset < 18 else
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["root"]),
             helper.make_node("Div", ["d", "root"], ["normed"]),
             helper.make_node("Mul", ["normed", "scale"], ["scaled"])]
    last = "scaled"
    if bias:
        nodes.append(helper.make_node("Add", ["scaled", "bias"], ["y"]))
        last = "y"
    nodes.append(helper.make_node("Relu", [last], ["out"]))
    rng = np.random.default_rng(3)
    inits = [_const("two", 2.0), _const("eps", 1e-5), numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "scale"),
             numpy_helper.from_array((0.1 * rng.standard_normal(16)).astype(np.float32), "bias")]
    outputs = [_tensor("out", [2, 5, 16])]
    if extra_reader:
        outputs.append(helper.make_empty_tensor_value_info(extra_reader))
    return _model(nodes, [_tensor("x", [2, 5, 16])], outputs, inits, opset)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
def test_layer_norm_fused_vs_onnxruntime(bias, opset, square):
    session = _differential(_layer_norm_model(bias=bias, opset=opset, square=square), {"x": (2, 5, 16)})
    fused = _rules(session, "layer_norm")
    assert len(fused) == 1 and fused.nodes_saved.iloc[0] == (8 if bias else 7)
    node = next(n for n in session.graph.nodes if n.op_type == "LayerNormalization")
    assert len(node.inputs) == (3 if bias else 2) and node.attrs["axis"] == -1


@pytest.mark.parametrize("reader", ["mean", "d", "sq", "var", "root", "normed"])
def test_layer_norm_blocked_by_a_reader_outside_the_chain(reader):
    session = _differential(_layer_norm_model(extra_reader=reader), {"x": (2, 5, 16)})
    assert _rules(session, "layer_norm").empty


def test_layer_norm_bias_read_elsewhere_keeps_its_add():
    """The scaled value read elsewhere: the Add stays out; LayerNormalization without bias."""
    session = _differential(_layer_norm_model(extra_reader="scaled"), {"x": (2, 5, 16)})
    fused = _rules(session, "layer_norm")
    assert len(fused) == 1 and fused.nodes_saved.iloc[0] == 7


def test_layer_norm_not_fused_below_opset_17():
    session = _differential(_layer_norm_model(opset=13), {"x": (2, 5, 16)})
    assert _rules(session, "layer_norm").empty


# --- inside If bodies ----------------------------------------------------------------


def _if_model(*, leak=False):
    """If(cond): the then-branch an RMSNorm of the outer x over outer constants, the
    else-branch an erf GELU whose sqrt 2 is the body's own Constant node, then SiLU.
    `leak`: each branch also outputs an intermediate (the Sqrt; the GELU's 1 + erf), so
    those chains must stay; the SiLU still fuses."""
    then_nodes = [helper.make_node("Pow", ["x", "two"], ["t_sq"]),
                  helper.make_node("ReduceMean", ["t_sq", "axes"], ["t_var"], keepdims=1),
                  helper.make_node("Add", ["t_var", "eps"], ["t_var_eps"]),
                  helper.make_node("Sqrt", ["t_var_eps"], ["t_root"]),
                  helper.make_node("Div", ["one", "t_root"], ["t_inv"]),
                  helper.make_node("Mul", ["x", "t_inv"], ["t_normed"]),
                  helper.make_node("Mul", ["w", "t_normed"], ["t_y"])]
    then_out = [_tensor("t_y", [2, 3, 8])]
    if leak:
        then_nodes.append(helper.make_node("Neg", ["t_root"], ["t_leak"]))
        then_out.append(_tensor("t_leak", [2, 3, 1]))
    else_nodes = [helper.make_node("Constant", [], ["e_sqrt2"], value=_const("e_sqrt2", math.sqrt(2.0))),
                  helper.make_node("Div", ["x", "e_sqrt2"], ["e_scaled"]),
                  helper.make_node("Erf", ["e_scaled"], ["e_erf"]),
                  helper.make_node("Add", ["e_erf", "one"], ["e_t"]),
                  helper.make_node("Mul", ["x", "e_t"], ["e_xt"]),
                  helper.make_node("Mul", ["e_xt", "half"], ["e_gelu"]),
                  helper.make_node("Sigmoid", ["e_gelu"], ["e_sig"]),
                  helper.make_node("Mul", ["e_gelu", "e_sig"], ["e_y"])]
    else_out = [_tensor("e_y", [2, 3, 8])]
    if leak:
        else_nodes.append(helper.make_node("Identity", ["e_t"], ["e_leak"]))
        else_out.append(_tensor("e_leak", [2, 3, 8]))
    outs = ["y"] + (["leak"] if leak else [])
    nodes = [helper.make_node("If", ["cond"], outs,
                              then_branch=helper.make_graph(then_nodes, "then", [], then_out),
                              else_branch=helper.make_graph(else_nodes, "else", [], else_out)),
             helper.make_node("Neg", ["y"], ["out"])]
    rng = np.random.default_rng(4)
    inits = [_const("two", 2.0), _const("eps", 1e-6), _const("one", 1.0), _const("half", 0.5),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(8)).astype(np.float32), "w")]
    outputs = [_tensor("out", [2, 3, 8])] + ([helper.make_empty_tensor_value_info("leak")] if leak else [])
    return _model(nodes, [_tensor("x", [2, 3, 8]), _tensor("cond", [], TensorProto.BOOL)], outputs, inits, 18)


def test_patterns_fused_inside_if_bodies_vs_onnxruntime():
    model = _if_model()
    session = _differential(model, {"x": (2, 3, 8), "cond": ()}, dtypes={"cond": np.bool_})
    rules = session.recording.rewrites().rule.tolist()
    # the body's Constant is folded into a body initializer at load (the GELU fusion, which
    # read it, drops it with the chain)
    assert sorted(rules) == ["constant_folding", "gelu", "rms_norm", "silu"], rules
    assert not any(body.initializers for body in session.graph.nodes[0].subgraphs.values())
    bodies = session.graph.nodes[0].subgraphs
    assert [n.op_type for n in bodies["then_branch"].nodes] == ["SimplifiedLayerNormalization"]
    assert [n.op_type for n in bodies["else_branch"].nodes] == ["Gelu", "QuickGelu"]
    loaded = session.loaded_graph.nodes[0].subgraphs
    assert len(loaded["then_branch"].nodes) == 7, "the loaded graph stays as it was"


def test_a_body_output_blocks_the_fusion_inside_the_body():
    model = _if_model(leak=True)
    session = _differential(model, {"x": (2, 3, 8), "cond": ()}, dtypes={"cond": np.bool_})
    assert session.recording.rewrites().rule.tolist() == ["constant_folding", "silu"]


# --- the builders' models ----------------------------------------------------------

BUILDERS = {
    "llama-onnx": (lambda: models.llama("small", flavor="onnx"), {"rms_norm": 13, "silu": 6}),
    "llama-dynamo-attention": (lambda: models.llama("small", flavor="onnx", export="torch-dynamo-attention"),
                               {"rms_norm": 13, "silu": 6}),
    # both If branches (with and without the cache) hold the whole model
    "llama-optimum-merged": (lambda: models.llama("small", flavor="onnx", export="optimum-merged"),
                             {"rms_norm": 26, "silu": 12}),
    "llama-genai": (lambda: models.llama("small", flavor="genai"), {"silu": 6}),
    "gpt2": (lambda: models.gpt2("small"), {"gelu": 8}),
}
_FUSIONS = ("rms_norm", "silu", "gelu", "layer_norm")


def _builder_feeds(oracle, rng, buffers):
    """Fill (or make) one buffer per input: a 5-token chunk after 3 cached positions."""
    dims = {"batch_size": 1, "sequence_length": 5, "past_sequence_length": 3, "total_sequence_length": 8}
    for i in oracle.get_inputs():
        if i.name not in buffers:
            shape = tuple(d if isinstance(d, int) else dims[d] for d in i.shape)
            dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}.get(
                i.type, np.float32)
            buffers[i.name] = np.empty(shape, dtype)
        buf = buffers[i.name]
        if i.name == "input_ids":
            buf[...] = rng.integers(0, 500, buf.shape)
        elif i.name == "position_ids":
            buf[...] = np.arange(3, 8)
        elif buf.dtype == np.bool_:
            buf[...] = True
        elif buf.dtype.kind == "i":
            buf[...] = 1
        else:
            buf[...] = rng.standard_normal(buf.shape) * 0.5
    return buffers


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_models_fused_vs_onnxruntime(name):
    build, expected = BUILDERS[name]
    model = build()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rewrites = session.recording.rewrites()
    counts = {rule: int((rewrites.rule == rule).sum()) for rule in _FUSIONS}
    assert counts == {rule: expected.get(rule, 0) for rule in _FUSIONS}
    rng = np.random.default_rng(9)
    buffers: dict = {}
    names = [o.name for o in oracle.get_outputs()]
    for run in range(6):
        _builder_feeds(oracle, rng, buffers)
        want = oracle.run(None, {k: v.copy() for k, v in buffers.items()})
        got = session.run(None, buffers)
        for g, w, out in zip(got, want, names, strict=True):
            # atol 1e-4: gpt2's logits differ by up to 5e-5 with no fusion at all (level
            # "all" relays the MatMul weights, so their sums run in another order)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {out}")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_models_greedy_tokens_match_onnxruntime(name):
    model = BUILDERS[name][0]()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    prompt = [5, 17, 42, 9, 311, 2]
    ours = workbench.Generator(session).generate(prompt, 12, progress=False, eos_token_id=-1)
    theirs = workbench.Generator(_ort(model)).generate(prompt, 12, progress=False, eos_token_id=-1)
    assert ours.tokens == theirs.tokens

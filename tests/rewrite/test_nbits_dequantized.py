"""Rule `nbits_dequantized` (level "all"): a MatMulNBits over constant weights runs as a
MatMul over them dequantized once, which the MatMul rules then fuse, pad and lay out.
It changes how the product is computed, never its value: checked against onnxruntime
run after run on one input buffer for each weight format, and where the rule must
leave a node alone (int8 compute, float16, weights fed at run time)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session, runs_on_one_buffer
from test_quant_ops_ort import _pack

import workbench
from workbench import SessionOptions

MS = "com.microsoft"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
RUNS = 8


def _weights(rng, prefix: str, K: int, N: int, bits: int, block_size: int, zero_points: str, g_idx: bool):
    """Initializers of one MatMulNBits weight and the input names that read them."""
    k_blocks = -(-K // block_size)
    q = rng.integers(0, 2**bits, (N, k_blocks * block_size))
    inits = [numpy_helper.from_array(_pack(q.reshape(N, k_blocks, block_size), bits), f"{prefix}B"),
             numpy_helper.from_array((rng.random(N * k_blocks) * 0.05 + 0.005).astype(np.float32), f"{prefix}scales")]
    names = [f"{prefix}B", f"{prefix}scales"]
    if zero_points == "packed":
        inits.append(numpy_helper.from_array(_pack(rng.integers(0, 2**bits, (N, k_blocks)), bits).reshape(-1),
                                             f"{prefix}zp"))
    elif zero_points == "float":
        inits.append(numpy_helper.from_array(rng.random(N * k_blocks).astype(np.float32) * 2**bits, f"{prefix}zp"))
    names.append(f"{prefix}zp" if zero_points != "none" else "")
    if g_idx:
        inits.append(numpy_helper.from_array((np.arange(K) // block_size).astype(np.int32), f"{prefix}g_idx"))
    names.append(f"{prefix}g_idx" if g_idx else "")
    return inits, names


def _model(K=64, N=96, bits=4, block_size=32, zero_points="packed", g_idx=False, bias=False, level=0,
           a_type=TensorProto.FLOAT, fed_weight=False):
    """x [1, 1, K] -> MatMulNBits -> Relu."""
    rng = np.random.default_rng(bits * 1000 + block_size + K)
    inits, names = _weights(rng, "", K, N, bits, block_size, zero_points, g_idx)
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
    names = ["x", *names, "bias" if bias else ""]
    while names[-1] == "":
        names.pop()
    graph_inputs = [helper.make_tensor_value_info("x", a_type, [1, 1, K])]
    if fed_weight:
        b = inits.pop(0)
        graph_inputs.append(helper.make_tensor_value_info(b.name, TensorProto.UINT8, list(b.dims)))
    nodes = [helper.make_node("MatMulNBits", names, ["y"], domain=MS, name="proj", K=K, N=N, bits=bits,
                              block_size=block_size, accuracy_level=level),
             helper.make_node("Relu", ["y"], ["out"])]
    graph = helper.make_graph(nodes, "nbits", graph_inputs,
                              [helper.make_tensor_value_info("y", a_type, [1, 1, N]),
                               helper.make_tensor_value_info("out", a_type, [1, 1, N])], inits)
    return helper.make_model(graph, opset_imports=OPSETS)


CASES = [
    pytest.param(dict(bits=4, block_size=32, zero_points="packed", bias=True), id="int4-zp-bias"),
    pytest.param(dict(bits=4, block_size=16, zero_points="none"), id="int4-default-zp"),
    pytest.param(dict(bits=8, block_size=64, zero_points="packed", K=96), id="int8-partial-block"),
    pytest.param(dict(bits=2, block_size=32, zero_points="packed", bias=True), id="int2"),
    pytest.param(dict(bits=4, block_size=32, zero_points="float"), id="float-zp"),
    pytest.param(dict(bits=4, block_size=32, zero_points="packed", g_idx=True), id="g_idx"),
    # accuracy_level 4 where MLAS has no int8 kernel (2-bit, block of 256): float32 compute
    pytest.param(dict(bits=2, block_size=256, zero_points="packed", level=4, K=512), id="level4-float32"),
]


@pytest.mark.parametrize("case", CASES)
def test_a_dequantized_product_computes_what_onnxruntime_does(case):
    model = _model(**case)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    rewrites = session.recording.rewrites().query("rule == 'nbits_dequantized'")
    assert rewrites.original_nodes.tolist() == [["proj"]]
    ops = [p.node.op_type for p in session.plan.nodes]
    assert "MatMulNBits" not in ops and "MatMul" in ops
    assert ops.count("Add") == (1 if case.get("bias") else 0)
    assert not {"B", "scales", "zp"} & {session.graph.values[v].name for v in session.graph.initializers}, \
        "the packed weight is dropped once nothing reads it"
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, case.get("K", 64)), RUNS,
                              np.random.default_rng(7), names=("y", "out"))
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


@pytest.mark.parametrize("why, case", [
    ("onnxruntime quantizes A to int8 here", dict(level=4)),
    ("int8 here too, A per 256", dict(level=4, block_size=512, K=1024)),
    ("a float16 product", dict(a_type=TensorProto.FLOAT16)),
    ("the weight is fed at run time", dict(fed_weight=True)),
])
def test_the_node_stays_where_its_product_is_not_a_float32_matmul_over_constants(why, case):
    model = _model(**case)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    assert session.recording.rewrites().query("rule == 'nbits_dequantized'").empty, why
    assert "MatMulNBits" in [p.node.op_type for p in session.plan.nodes], why


def test_sibling_projections_fuse_once_dequantized():
    """Q, K and V MatMulNBits of one input become three MatMuls and then one (matmul_siblings)."""
    rng = np.random.default_rng(3)
    K, widths = 128, (128, 64, 64)
    inits, nodes = [], []
    for name, N in zip("qkv", widths, strict=True):
        w_inits, w_names = _weights(rng, name, K, N, 4, 32, "packed", False)
        inits += w_inits
        nodes.append(helper.make_node("MatMulNBits", ["x", *w_names[:3]], [name], domain=MS, name=f"{name}_proj",
                                      K=K, N=N, bits=4, block_size=32))
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, K])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, N])
                               for n, N in zip("qkv", widths, strict=True)], inits)
    model = helper.make_model(graph, opset_imports=OPSETS)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    rewrites = session.recording.rewrites()
    assert len(rewrites.query("rule == 'nbits_dequantized'")) == 3
    fused = rewrites.query("rule == 'matmul_siblings'")
    assert len(fused) == 1 and sorted(fused.original_nodes.iloc[0]) == ["k_proj", "q_proj", "v_proj"]
    assert [p.node.op_type for p in session.plan.nodes].count("MatMul") == 1
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, K), RUNS, np.random.default_rng(8), names="qkv")
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")

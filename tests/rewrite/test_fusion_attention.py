"""Differential tests for the ``attention`` fusion rule (`rewrite.fusion_attention`):
repeat_kv + Q K^T + scale + mask + Softmax + @ V as one
ai.workbench MaskedSoftmaxAttention.

A fusion changes how a value is computed, never the value: each form runs on one
buffer per input whose contents change every run (the mask too, always with one fully
masked row), under the default mechanisms (memo, capture, views), every output compared
with onnxruntime running the unfused graph; each test asserts the rewrite happened (or,
for a chain that must stay, that it did not). The builders' decoders must give
onnxruntime's greedy tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort

import workbench
from workbench import SessionOptions, models
from workbench.rewrite import fusion, fusion_attention

RUNS = 7
F32 = TensorProto.FLOAT
FILL = float(np.finfo(np.float32).min)  # -3.4028234663852886e+38, as torch exports it


@pytest.fixture(autouse=True)
def _attention_rule(monkeypatch):
    """The rule runs in this module's sessions whether or not `fusion.RULES` lists it."""
    if fusion_attention.fuse_attention not in fusion.RULES:
        monkeypatch.setattr(fusion, "RULES", [*fusion.RULES, fusion_attention.fuse_attention])


def _c(name, value, dtype):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _repeat_kv(nodes, x, prefix, kv_heads, rep, heads, width, tile=False):
    """torch's repeat_kv: Unsqueeze(2) -> Expand [B, KV, rep, T, D] -> Reshape [B, H, T, D],
    the batch read from Q's shape and the length from x's, as the exporters write it."""
    nodes += [
        helper.make_node("Shape", ["q"], [f"{prefix}_qshape"]),
        helper.make_node("Gather", [f"{prefix}_qshape", "i0"], [f"{prefix}_b0"], axis=0),
        helper.make_node("Unsqueeze", [f"{prefix}_b0", "ax0"], [f"{prefix}_b"]),
        helper.make_node("Shape", [x], [f"{prefix}_xshape"]),
        helper.make_node("Gather", [f"{prefix}_xshape", "i2"], [f"{prefix}_t0"], axis=0),
        helper.make_node("Unsqueeze", [f"{prefix}_t0", "ax0"], [f"{prefix}_t"]),
        helper.make_node("Concat", [f"{prefix}_b", *(["c_rep", "c_kv"] if tile else ["c_kv", "c_rep"]),
                                    f"{prefix}_t", "c_d"], [f"{prefix}_s5"], axis=0),
        helper.make_node("Concat", [f"{prefix}_b", "c_h", f"{prefix}_t", "c_d"], [f"{prefix}_s4"], axis=0),
        helper.make_node("Unsqueeze", [x, "ax1" if tile else "ax2"], [f"{prefix}_x5"]),
        helper.make_node("Expand", [f"{prefix}_x5", f"{prefix}_s5"], [f"{prefix}_e"]),
        helper.make_node("Reshape", [f"{prefix}_e", f"{prefix}_s4"], [f"{prefix}_rep"]),
    ]
    return f"{prefix}_rep", [_c("c_kv", [kv_heads], np.int64), _c("c_rep", [rep], np.int64),
                             _c("c_h", [heads], np.int64), _c("c_d", [width], np.int64)]


def _attention_inputs(heads, kv_heads, seq, past, width, mask_type, mask_dims):
    """The graph inputs every attention model here takes: q, the past and new K / V, the mask."""
    return [helper.make_tensor_value_info("q", F32, ["B", heads, seq, width]),
            helper.make_tensor_value_info("past_k", F32, ["B", kv_heads, past, width]),
            helper.make_tensor_value_info("new_k", F32, ["B", kv_heads, seq, width]),
            helper.make_tensor_value_info("past_v", F32, ["B", kv_heads, past, width]),
            helper.make_tensor_value_info("new_v", F32, ["B", kv_heads, seq, width]),
            helper.make_tensor_value_info("mask", mask_type, mask_dims)]


def _attention_model(*, heads=4, kv_heads=2, seq=3, past=5, width=8, mask="where", leak=None,
                     softmax_axis=-1, scale_input=False, mask_batch=None, opset=18, tile=False,
                     fused_matmul=None):
    """q [B, H, S, D]; present k / v = Concat(past, new) (graph outputs); repeat_kv when
    heads > kv_heads; MatMul(q, k^T) * scale -> Where(mask, ., FILL) | Add(mask) ->
    Softmax -> MatMul(., v) -> y, then y * 2 (so y is not only a graph output).
    `leak` names an intermediate that also becomes a graph output. `fused_matmul` (a dict
    of attributes): the scores as onnxruntime's optimizer writes them,
    com.microsoft FusedMatMul(q, k^T, alpha=scale) with those attributes."""
    rep = heads // kv_heads
    total = past + seq
    nodes = [helper.make_node("Concat", ["past_k", "new_k"], ["present_k"], axis=2),
             helper.make_node("Concat", ["past_v", "new_v"], ["present_v"], axis=2)]
    inits = [_c("i0", 0, np.int64), _c("i2", 2, np.int64), _c("ax0", [0], np.int64), _c("ax1", [1], np.int64),
             _c("ax2", [2], np.int64),
             _c("fill", FILL, np.float32), _c("two", 2.0, np.float32)]
    k, v = "present_k", "present_v"
    if rep > 1:
        k, extra = _repeat_kv(nodes, k, "rk", kv_heads, rep, heads, width, tile)
        v, _ = _repeat_kv(nodes, v, "rv", kv_heads, rep, heads, width, tile)
        inits += extra
    scale = "scale"
    if not scale_input:
        inits.append(_c("scale", 1.0 / np.sqrt(width), np.float32))
    if fused_matmul is not None:
        nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("FusedMatMul", ["q", "kt"], ["scores"], domain="com.microsoft",
                                   alpha=float(1.0 / np.sqrt(width)), **fused_matmul)]
    else:
        nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["q", "kt"], ["qk"]),
                  helper.make_node("Mul", ["qk", scale], ["scores"])]
    if mask == "where":
        nodes.append(helper.make_node("Where", ["mask", "scores", "fill"], ["masked"]))
    else:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked"], ["probs"], axis=softmax_axis),
              helper.make_node("MatMul", ["probs", v], ["y"]),
              helper.make_node("Mul", ["y", "two"], ["y2"])]
    inputs = _attention_inputs(heads, kv_heads, seq, past, width, TensorProto.BOOL if mask == "where" else F32,
                               [mask_batch or "B", 1, seq, total])
    if scale_input:
        inputs.append(helper.make_tensor_value_info("scale", F32, []))
    outputs = [helper.make_tensor_value_info(n, F32, None) for n in ("y2", "present_k", "present_v")]
    if leak is not None:
        outputs.append(helper.make_tensor_value_info(leak, F32, None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if fused_matmul is not None else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _fill(buffers, rng, run, mask):
    for name, buf in buffers.items():
        if name == "mask":
            if buf.dtype == np.bool_:
                buf[...] = rng.random(buf.shape) < 0.7
                buf[..., -1] = True
                buf[..., 0, :] = False  # one fully masked row: a uniform softmax (Where form)
            else:
                buf[...] = rng.standard_normal(buf.shape) * 3
                buf[..., min(1, buf.shape[-2] - 1), 2:] = -np.inf
                if run % 2:
                    buf[..., 0, :] = -np.inf  # fully masked: NaN, unfused and fused alike
        elif name == "scale":
            buf[...] = 0.1 + run * 0.05
        else:
            buf[...] = rng.standard_normal(buf.shape) * (1.0 + run)


def _differential(model, *, batch=1, seed=0, backend="cpu", sizes=None):
    """RUNS runs on stable input buffers with new contents, every output vs onnxruntime.
    A named dim is `sizes`' entry for it, else the batch."""
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False), backend=backend)
    oracle = _ort(model)
    rng = np.random.default_rng(seed)
    buffers = {}
    for i in oracle.get_inputs():
        shape = tuple(d if isinstance(d, int) else (sizes or {}).get(d, batch) for d in i.shape)
        buffers[i.name] = np.empty(shape, np.bool_ if i.type == "tensor(bool)" else np.float32)
    names = [o.name for o in oracle.get_outputs()]
    for run in range(RUNS):
        _fill(buffers, rng, run, "mask")
        want = oracle.run(None, {k: v.copy() for k, v in buffers.items()})
        got = session.run(None, buffers)
        for g, w, name in zip(got, want, names, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, f"run {run}: {name}"
            # run r scales the inputs by 1 + r, and float32 rounding of the score and
            # weighted sums with them (BLAS kernels differ by CPU: seen on an AMD Zen 5)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * (1 + run), err_msg=f"run {run}: {name}")
    return session


def _attention_rewrites(session):
    rewrites = session.recording.rewrites()
    return rewrites[rewrites.rule == "attention"]


def _fused_nodes(session):
    return [n for n in session.graph.nodes if n.op_type == "MaskedSoftmaxAttention"]


@pytest.mark.parametrize("heads,kv_heads,seq,batch", [(4, 2, 3, 1), (8, 2, 1, 1), (2, 2, 3, 1), (4, 1, 4, 2),
                                                       (6, 3, 2, 3)])
def test_where_masked_attention_fused_vs_onnxruntime(heads, kv_heads, seq, batch):
    session = _differential(_attention_model(heads=heads, kv_heads=kv_heads, seq=seq), batch=batch)
    rows = _attention_rewrites(session)
    assert len(rows) == 1 and len(_fused_nodes(session)) == 1
    rep = heads // kv_heads
    # GQA: 3 repeat nodes a side, and the 8 shape nodes a side only they read, go too
    assert int(rows.nodes_saved.iloc[0]) == (5 + 6 + 16 if rep > 1 else 5)
    node = _fused_nodes(session)[0]
    assert node.attrs["kv_repeat"] == rep and node.attrs["mask_mode"] == "where"
    ops = {n.op_type for n in session.graph.nodes}
    assert not ops & {"Softmax", "Where", "Expand", "Transpose"}


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)])
def test_additive_mask_attention_fused_vs_onnxruntime(heads, kv_heads):
    """-inf rows give NaN in both graphs; finite masks are added to the scaled scores."""
    session = _differential(_attention_model(heads=heads, kv_heads=kv_heads, mask="add"))
    assert len(_attention_rewrites(session)) == 1
    assert _fused_nodes(session)[0].attrs["mask_mode"] == "add"


@pytest.mark.parametrize("mask", ["where", "add"])
@pytest.mark.parametrize("heads,kv_heads,batch", [(4, 2, 1), (6, 3, 2), (2, 2, 1)])
def test_scores_as_onnxruntimes_fused_matmul_fused_vs_onnxruntime(mask, heads, kv_heads, batch):
    """onnxruntime's optimizer writes the scaled scores as FusedMatMul(q, k^T, alpha): the
    chain is fused all the same (alpha the scale), each value onnxruntime's."""
    session = _differential(_attention_model(heads=heads, kv_heads=kv_heads, mask=mask, fused_matmul={}),
                            batch=batch)
    (node,) = _fused_nodes(session)
    assert node.attrs["kv_repeat"] == heads // kv_heads and node.attrs["mask_mode"] == mask
    assert not {n.op_type for n in session.graph.nodes} & {"FusedMatMul", "Softmax", "Expand", "Transpose"}


@pytest.mark.parametrize("attrs", [{"transA": 1}, {"transB": 1}])
def test_a_fused_matmul_that_transposes_is_not_taken_for_the_scores(attrs):
    """A FusedMatMul that transposes one side computes other products: not fused (the
    values, onnxruntime's, say the model ran as written)."""
    model = _attention_model(heads=4, kv_heads=4, seq=5, past=0, width=5, fused_matmul=attrs)
    session = _differential(model)
    assert not _fused_nodes(session)


def test_mask_broadcasting_the_scores_up_is_computed_as_unfused():
    """A mask of batch 2 on scores of batch 1: the masked scores are [2, H, S, L]; the
    kernel takes its explicit-repeat path, as the unfused MatMul broadcasts."""
    model = _attention_model(heads=4, kv_heads=2, mask_batch=2)
    session = _differential(model, batch=1)
    assert len(_attention_rewrites(session)) == 1


@pytest.mark.parametrize("leak", ["probs", "masked", "scores", "qk", "kt", "rk_rep", "rv_rep", "rk_e", "rk_x5"])
def test_attention_blocked_by_an_intermediate_read_outside_the_chain(leak):
    session = _differential(_attention_model(leak=leak))
    assert len(_attention_rewrites(session)) == 0
    assert not _fused_nodes(session)


def test_attention_blocked_by_a_second_reader_node():
    model = _attention_model()
    model.graph.node.append(helper.make_node("Neg", ["scores"], ["neg"]))
    model.graph.output.append(helper.make_tensor_value_info("neg", F32, None))
    session = _differential(model)
    assert len(_attention_rewrites(session)) == 0


@pytest.mark.parametrize("case", ["softmax_axis", "scale_input"])
def test_attention_not_fused_when_not_equivalent(case):
    model = _attention_model(softmax_axis=2) if case == "softmax_axis" else _attention_model(scale_input=True)
    session = _differential(model)
    assert len(_attention_rewrites(session)) == 0


def test_a_tile_of_kv_heads_is_not_taken_for_a_head_repeat():
    """Unsqueeze(1) -> Expand [B, rep, KV, T, D] -> Reshape tiles the heads (head h reads
    kv head h % KV, not h // rep): the repeats stay, and the rest of the chain is fused
    with kv_repeat 1, reading the tiled K and V."""
    session = _differential(_attention_model(heads=4, kv_heads=2, tile=True))
    rows = _attention_rewrites(session)
    assert len(rows) == 1 and int(rows.nodes_saved.iloc[0]) == 5
    assert _fused_nodes(session)[0].attrs["kv_repeat"] == 1
    assert sum(n.op_type == "Expand" for n in session.graph.nodes) == 2


# --- torch's scaled_dot_product_attention, as torch.onnx (and optimum through it) writes it


def _torch_repeat_kv(nodes, x, prefix, rep):
    """repeat_kv as torch.onnx's TorchScript exporter writes it: every size read off x's
    shape, the Expand's shape passed through Where(Equal(s, -1s), 1s, s) (its way of
    keeping a -1 dim), the heads of the Reshape computed as Hkv * rep."""
    dims = []
    for i in range(4):
        nodes += [helper.make_node("Shape", [x], [f"{prefix}_shape{i}"]),
                  helper.make_node("Gather", [f"{prefix}_shape{i}", f"i{i}"], [f"{prefix}_d{i}"], axis=0),
                  helper.make_node("Unsqueeze", [f"{prefix}_d{i}", "ax0"], [f"{prefix}_u{i}"])]
        dims.append(f"{prefix}_u{i}")
    nodes += [
        helper.make_node("Concat", [dims[0], dims[1], "c_rep", dims[2], dims[3]], [f"{prefix}_cat"], axis=0),
        helper.make_node("Reshape", [f"{prefix}_cat", "minus1"], [f"{prefix}_s"]),
        helper.make_node("Shape", [f"{prefix}_s"], [f"{prefix}_slen"]),
        helper.make_node("ConstantOfShape", [f"{prefix}_slen"], [f"{prefix}_ones"],
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Mul", [f"{prefix}_ones", "minus1_scalar"], [f"{prefix}_m1"]),
        helper.make_node("Equal", [f"{prefix}_s", f"{prefix}_m1"], [f"{prefix}_eq"]),
        helper.make_node("Where", [f"{prefix}_eq", f"{prefix}_ones", f"{prefix}_s"], [f"{prefix}_s5"]),
        helper.make_node("Unsqueeze", [x, "ax2"], [f"{prefix}_x5"]),
        helper.make_node("Expand", [f"{prefix}_x5", f"{prefix}_s5"], [f"{prefix}_e"]),
        helper.make_node("Mul", [f"{prefix}_d1", "rep_scalar"], [f"{prefix}_h"]),
        helper.make_node("Unsqueeze", [f"{prefix}_h", "ax0"], [f"{prefix}_uh"]),
        helper.make_node("Concat", [dims[0], f"{prefix}_uh", dims[2], dims[3]], [f"{prefix}_s4"], axis=0),
        helper.make_node("Reshape", [f"{prefix}_e", f"{prefix}_s4"], [f"{prefix}_rep"]),
    ]
    return f"{prefix}_rep"


def _sdpa_tail(v, masked_fill, guard_fill):
    """From "kt" (K^T) on, as torch writes scaled_dot_product_attention: q * root @ kt *
    root + Where(mask, 0, masked_fill) -> Softmax -> Where(IsNaN(p), guard_fill, p) @ v,
    then y * 2 (so y is not only a graph output)."""
    return [helper.make_node("Mul", ["q", "root"], ["qs"]),
            helper.make_node("Mul", ["kt", "root"], ["kts"]),
            helper.make_node("MatMul", ["qs", "kts"], ["scores"]),
            helper.make_node("Where", ["mask", "zero", masked_fill], ["additive"]),
            helper.make_node("Add", ["scores", "additive"], ["masked"]),
            helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
            helper.make_node("IsNaN", ["probs"], ["nan"]),
            helper.make_node("Where", ["nan", guard_fill, "probs"], ["guarded"]),
            helper.make_node("MatMul", ["guarded", v], ["y"]),
            helper.make_node("Mul", ["y", "two"], ["y2"])]


def _torch_sdpa_model(*, heads=6, kv_heads=2, seq=2, past=5, width=8, guard_fill=0.0, read_dim=2,
                      scale_from_width=False):
    """torch's scaled_dot_product_attention after torch.onnx: q * sqrt(scale) @
    (K_r^T * sqrt(scale)) + Where(mask, 0, -inf) -> Softmax -> Where(IsNaN(p), 0, p) @ V_r,
    the repeated K's dim `read_dim` and the repeated V's width read off their shapes
    (graph outputs here), as optimum and torch.onnx read them. `scale_from_width`: the
    scale computed at run time from Q's width, as optimum's gpt2 does."""
    rep = heads // kv_heads
    nodes = [helper.make_node("Concat", ["past_k", "new_k"], ["present_k"], axis=2),
             helper.make_node("Concat", ["past_v", "new_v"], ["present_v"], axis=2)]
    if scale_from_width:
        nodes += [helper.make_node("Shape", ["q"], ["q_shape"]),
                  helper.make_node("Slice", ["q_shape", "minus1", "int_max"], ["q_width"]),
                  helper.make_node("Cast", ["q_width"], ["q_width_f"], to=F32),
                  helper.make_node("Sqrt", ["q_width_f"], ["q_width_root"]),
                  helper.make_node("Div", ["one", "q_width_root"], ["scale"]),
                  helper.make_node("Cast", ["scale"], ["scale_f"], to=F32),
                  helper.make_node("Sqrt", ["scale_f"], ["root"])]
    k = _torch_repeat_kv(nodes, "present_k", "rk", rep)
    v = _torch_repeat_kv(nodes, "present_v", "rv", rep)
    root = np.float32(1.0 / np.sqrt(np.sqrt(width)))
    nodes += [
        helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
        *_sdpa_tail(v, "minus_inf", "guard_fill"),
        helper.make_node("Shape", [k], ["k_rep_shape"]),
        helper.make_node("Gather", ["k_rep_shape", f"i{read_dim}"], ["k_rep_dim"], axis=0),
        helper.make_node("Shape", [v], ["v_rep_shape"]),
        helper.make_node("Gather", ["v_rep_shape", "i3"], ["v_rep_width"], axis=0),
    ]
    inits = [*(_c(f"i{i}", i, np.int64) for i in range(4)), _c("ax0", [0], np.int64), _c("ax2", [2], np.int64),
             _c("c_rep", [rep], np.int64), _c("rep_scalar", rep, np.int64), _c("minus1", [-1], np.int64),
             _c("minus1_scalar", -1, np.int64), _c("zero", 0.0, np.float32),
             _c("minus_inf", -np.inf, np.float32), _c("guard_fill", guard_fill, np.float32),
             _c("two", 2.0, np.float32)]
    inits += ([_c("one", [1.0], np.float32), _c("int_max", [np.iinfo(np.int64).max], np.int64)] if scale_from_width
              else [_c("root", root, np.float32)])
    inputs = _attention_inputs(heads, kv_heads, seq, past, width, TensorProto.BOOL, ["B", 1, seq, past + seq])
    outputs = [helper.make_tensor_value_info(n, F32, None) for n in ("y2", "present_k", "present_v")]
    outputs += [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("k_rep_dim", "v_rep_width")]
    graph = helper.make_graph(nodes, "torch_sdpa", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("heads,kv_heads,seq,batch", [(6, 2, 2, 1), (9, 3, 1, 1), (4, 4, 3, 2), (8, 1, 1, 2)])
def test_torch_sdpa_attention_fused_vs_onnxruntime(heads, kv_heads, seq, batch):
    """The scale split over Q and K^T, the additive mask (with a fully masked row: NaN
    rows the guard zeroes), the NaN guard, torch.onnx's repeat_kv shapes and the Shape
    reads of the repeated K and V: fused into one node, each value onnxruntime's."""
    session = _differential(_torch_sdpa_model(heads=heads, kv_heads=kv_heads, seq=seq), batch=batch)
    (fused,) = _fused_nodes(session)
    assert fused.attrs["nan_guard"] == 1 and fused.attrs["mask_mode"] == "add"
    assert fused.attrs["kv_repeat"] == heads // kv_heads and len(fused.inputs) == 7
    if heads > kv_heads:  # the repeats and the shape arithmetic only they read are gone
        assert not any(n.op_type in ("Expand", "Equal", "ConstantOfShape") for n in session.graph.nodes)


def _dynamo_repeat_kv(nodes, x, prefix, kv_heads, rep, width):
    """repeat_kv as torch.onnx's dynamo exporter writes it: the batch as Shape(x, 0, 1),
    the length as past + new read off their shapes, the Reshape with allowzero=1."""
    nodes += [
        helper.make_node("Shape", [x], [f"{prefix}_b"], start=0, end=1),
        helper.make_node("Unsqueeze", [x, "ax2"], [f"{prefix}_x5"]),
        helper.make_node("Concat", [f"{prefix}_b", "c_kv", "c_rep", "length", "c_d"], [f"{prefix}_s5"], axis=0),
        helper.make_node("Expand", [f"{prefix}_x5", f"{prefix}_s5"], [f"{prefix}_e"]),
        helper.make_node("Concat", [f"{prefix}_b", "c_h", "length", "c_d"], [f"{prefix}_s4"], axis=0),
        helper.make_node("Reshape", [f"{prefix}_e", f"{prefix}_s4"], [f"{prefix}_rep"], allowzero=1),
    ]
    return f"{prefix}_rep"


def _dynamo_sdpa_model(*, heads=6, kv_heads=2, width=8, swap_dims=False, one_new_token=False):
    """torch's scaled_dot_product_attention after torch.onnx's dynamo exporter: as
    `_torch_sdpa_model`, with K^T written as Reshape(Transpose(Reshape(K_r, [-1, L, D]),
    [0, 2, 1]), [B, H, D, L]) from slices of K_r's shape (`swap_dims`: the last Reshape
    keeps [B, H, L, D] instead, which is not a transpose), and the presents' length
    declared "P + S" as that exporter declares it. `one_new_token`: a decode step's model
    as transformers' exporter writes it, S = 1 and the length past + 1 (the 1 a constant),
    the presents declared "P + 1"."""
    rep = heads // kv_heads
    seq, total = (1, "P + 1") if one_new_token else ("S", "P + S")
    nodes = [helper.make_node("Concat", ["past_k", "new_k"], ["present_k"], axis=2),
             helper.make_node("Concat", ["past_v", "new_v"], ["present_v"], axis=2),
             helper.make_node("Shape", ["past_k"], ["p_len"], start=2, end=3),
             helper.make_node("Shape", ["new_k"], ["s_len"], start=2, end=3),
             helper.make_node("Squeeze", ["p_len"], ["p_scalar"]),
             helper.make_node("Squeeze", ["s_len"], ["s_scalar"]),
             helper.make_node("Add", ["p_scalar", "one_count" if one_new_token else "s_scalar"], ["total"]),
             helper.make_node("Reshape", ["total", "minus1"], ["length"])]
    k = _dynamo_repeat_kv(nodes, "present_k", "rk", kv_heads, rep, width)
    v = _dynamo_repeat_kv(nodes, "present_v", "rv", kv_heads, rep, width)
    last = ["k_lead", "k_d", "k_l"] if not swap_dims else ["k_lead", "k_l", "k_d"]
    nodes += [
        helper.make_node("Shape", [k], ["k_shape"], start=0),
        helper.make_node("Slice", ["k_shape", "minus2", "minus1"], ["k_l"]),
        helper.make_node("Slice", ["k_shape", "minus1", "int_max"], ["k_d"]),
        helper.make_node("Slice", ["k_shape", "int_min", "minus2"], ["k_lead"]),
        helper.make_node("Concat", ["minus1", "k_l", "k_d"], ["k_rows_shape"], axis=0),
        helper.make_node("Reshape", [k, "k_rows_shape"], ["k_rows"]),
        helper.make_node("Transpose", ["k_rows"], ["k_rows_t"], perm=[0, 2, 1]),
        helper.make_node("Concat", last, ["kt_shape"], axis=0),
        helper.make_node("Reshape", ["k_rows_t", "kt_shape"], ["kt"]),
        *_sdpa_tail(v, "lowest", "zero"),
    ]
    root = np.float32(1.0 / np.sqrt(np.sqrt(width)))
    inits = [_c("ax2", [2], np.int64), _c("c_kv", [kv_heads], np.int64), _c("c_rep", [rep], np.int64),
             _c("c_h", [heads], np.int64), _c("c_d", [width], np.int64), _c("minus1", [-1], np.int64),
             _c("minus2", [-2], np.int64), _c("int_max", [np.iinfo(np.int64).max], np.int64),
             _c("int_min", [np.iinfo(np.int64).min], np.int64), _c("root", root, np.float32),
             _c("zero", 0.0, np.float32), _c("lowest", FILL, np.float32), _c("two", 2.0, np.float32),
             _c("one_count", 1, np.int64)]
    inputs = _attention_inputs(heads, kv_heads, seq, "P", width, TensorProto.BOOL, ["B", 1, seq, total])
    presents = [helper.make_tensor_value_info(n, F32, ["B", kv_heads, total, width]) for n in ("present_k", "present_v")]
    outputs = [helper.make_tensor_value_info("y2", F32, None), *presents]
    graph = helper.make_graph(nodes, "dynamo_sdpa", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    model.graph.value_info.extend(presents)
    return model


@pytest.mark.parametrize("heads,kv_heads,batch", [(6, 2, 1), (9, 3, 2), (4, 4, 1)])
def test_dynamo_sdpa_attention_fused_vs_onnxruntime(heads, kv_heads, batch):
    """K^T as a transpose of the last two dims over the rows of the leading ones, the
    repeat's sizes read off shapes (the length as past + new, allowzero=1): fused, each
    value onnxruntime's."""
    session = _differential(_dynamo_sdpa_model(heads=heads, kv_heads=kv_heads), batch=batch,
                            sizes={"S": 2, "P": 5, "P + S": 7})
    (fused,) = _fused_nodes(session)
    assert fused.attrs["nan_guard"] == 1 and fused.attrs["kv_repeat"] == heads // kv_heads
    assert not any(n.op_type in ("Expand", "Transpose") for n in session.graph.nodes)


@pytest.mark.parametrize("heads,kv_heads,batch", [(6, 2, 1), (4, 4, 2)])
def test_dynamo_sdpa_with_the_length_as_past_plus_one_fused_vs_onnxruntime(heads, kv_heads, batch):
    """transformers' exporter's decode step: the repeat's length written as past + 1 (a
    constant count) is the present's "P + 1": the repeat is absorbed (kv_repeat = r, no
    Expand left), each value onnxruntime's over runs of growing pasts."""
    model = _dynamo_sdpa_model(heads=heads, kv_heads=kv_heads, one_new_token=True)
    for past in (3, 4, 6):
        session = _differential(model, batch=batch, seed=past, sizes={"P": past, "P + 1": past + 1})
        (fused,) = _fused_nodes(session)
        assert fused.attrs["kv_repeat"] == heads // kv_heads
        assert not any(n.op_type in ("Expand", "Transpose") for n in session.graph.nodes)


def test_dynamo_sdpa_reshape_that_is_not_a_transpose_stays():
    """The last Reshape to [B, H, L, D] after the rows' transpose mixes elements (not
    K^T): the chain stays, and its values are onnxruntime's."""
    model = _dynamo_sdpa_model(heads=4, kv_heads=2, width=4, swap_dims=True)
    session = _differential(model, sizes={"S": 2, "P": 2, "P + S": 4})
    assert not _fused_nodes(session)


@pytest.mark.cuda
def test_torch_sdpa_attention_fused_on_cuda_vs_onnxruntime():
    """The same on the CUDA backend: the guard a device-side masked write, no host read."""
    session = _differential(_torch_sdpa_model(heads=9, kv_heads=3, seq=1), backend="cuda")
    assert len(_fused_nodes(session)) == 1


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_a_scale_computed_from_qs_width_is_fused_vs_onnxruntime(heads, kv_heads):
    """optimum's gpt2 computes the scale from Slice(Shape(q), -1) at run time: the rule
    computes it at load, with the graph's own kernels, for the width the inferred
    shapes give, and the fused node checks that width at run time."""
    session = _differential(_torch_sdpa_model(heads=heads, kv_heads=kv_heads, width=16, scale_from_width=True))
    (fused,) = _fused_nodes(session)
    assert fused.attrs["q_width"] == 16
    q = next(v for v, value in enumerate(session.graph.values) if value.name == "q")
    assert not any(n.op_type == "Sqrt" or q in n.inputs for n in session.graph.nodes if n is not fused)


def test_a_scale_computed_for_a_width_the_shapes_got_wrong_fails_naming_the_node():
    """A model whose declared shapes give Q another width than it has: the scale
    computed at load would be wrong, so the fused node refuses the run, naming itself.
    (Q comes out of a Relu: an Identity would be removed at load, its readers given
    the input with its true, symbolic width.)"""
    model = _torch_sdpa_model(heads=4, kv_heads=4, width=16, scale_from_width=True)
    model.graph.node.insert(0, helper.make_node("Relu", ["q_in"], ["q"]))
    model.graph.input[0].name = "q_in"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "W"
    model.graph.value_info.append(helper.make_tensor_value_info("q", F32, ["B", 4, 2, 16]))
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    (fused,) = _fused_nodes(session)
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in session.get_inputs()}
    feeds["q_in"] = np.zeros((1, 4, 2, 8), np.float32)
    feeds["mask"] = np.ones(feeds["mask"].shape, bool)
    with pytest.raises(workbench.WorkbenchError, match=f"(?s){fused.name}.*8 wide.*width 16"):
        session.run(None, feeds)


@pytest.mark.parametrize("case", ["guard_fill", "read_heads"])
def test_torch_sdpa_attention_not_fused_when_not_equivalent(case):
    """A guard that fills NaN rows with something other than 0, or a read of the
    repeated K's head count (not K's): the chain stays."""
    model = (_torch_sdpa_model(guard_fill=0.5) if case == "guard_fill" else _torch_sdpa_model(read_dim=1))
    session = _differential(model)
    assert not _fused_nodes(session)


# --- the builders' decoders ------------------------------------------------------------

BUILDERS = {
    "llama-onnx": (lambda: models.llama("small", flavor="onnx"), 6, 21),
    # both If branches (with and without the cache) hold the whole model
    "llama-optimum-merged": (lambda: models.llama("small", flavor="onnx", export="optimum-merged"), 12, 21),
    "gpt2": (lambda: models.gpt2("small"), 8, 5),
}
PROMPT = [5, 17, 42, 9, 311, 2]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_models_list_the_attention_rewrites(name):
    build, count, saved = BUILDERS[name]
    session = workbench.InferenceSession(build(), SessionOptions(decode_memo_verify=False))
    rows = _attention_rewrites(session)
    assert len(rows) == count
    assert min(rows.nodes_saved) == saved
    # beyond that only a body's Constant nodes that the last fused layer alone still read
    for r in rows.itertuples():
        assert list(r.original_ops).count("Constant") == r.nodes_saved - saved
    assert all(str(r).endswith("MaskedSoftmaxAttention") for r in rows.result)


@pytest.mark.parametrize("kv", ["growing", "fixed"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_models_greedy_tokens_match_onnxruntime(name, kv):
    model = BUILDERS[name][0]()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    assert len(_attention_rewrites(session)) == BUILDERS[name][1]
    ours = workbench.Generator(session).generate(PROMPT, 16, progress=False, eos_token_id=-1, kv=kv)
    theirs = workbench.Generator(_ort(model)).generate(PROMPT, 16, progress=False, eos_token_id=-1, kv=kv)
    assert ours.tokens == theirs.tokens


def test_fused_and_unfused_workbench_decodes_agree():
    """The fused session and the unfused one (level "basic") pick the same tokens."""
    model = models.llama("tiny", flavor="onnx")
    fused = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    plain = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False,
                                                             graph_optimization_level="basic"))
    assert len(_attention_rewrites(fused)) == 2 and len(_attention_rewrites(plain)) == 0
    a = workbench.Generator(fused).generate(PROMPT, 8, progress=False, eos_token_id=-1)
    b = workbench.Generator(plain).generate(PROMPT, 8, progress=False, eos_token_id=-1)
    assert a.tokens == b.tokens


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("form", ["where", "add", "dynamo_sdpa"])
def test_one_token_attention_runs_compiled_vs_onnxruntime(form, compiled, monkeypatch):
    """A decode step's one query token (batch 1): the fused kernel's float32 form
    compiled in one call (`ops.attention_jit`) where numba is, numpy's otherwise; a
    Where mask (with its fully masked row: a uniform softmax), an additive one (-inf
    rows: NaN, as unfused), and dynamo's SDPA (the scale split over Q and K, a NaN
    guard); GQA heads. Every run against onnxruntime's unfused graph."""
    from workbench.ops import attention_jit

    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    calls = []
    real = attention_jit.decode
    monkeypatch.setattr(attention_jit, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    if form == "dynamo_sdpa":
        session = _differential(_dynamo_sdpa_model(heads=6, kv_heads=2), sizes={"S": 1, "P": 5, "P + S": 6})
    else:
        session = _differential(_attention_model(heads=8, kv_heads=2, seq=1, mask=form))
    assert len(_fused_nodes(session)) == 1
    assert len(calls) == (RUNS if compiled else 0)

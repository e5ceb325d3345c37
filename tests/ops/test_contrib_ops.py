"""Native contrib / LLM kernels against onnxruntime (CPUExecutionProvider) and onnx.reference.

Each case builds a one-node model with onnx.helper, runs onnxruntime, then runs the
workbench kernel through the registry contract (`fn(inputs, outs)`) twice: with no
preallocated outputs and with preallocated outputs of onnxruntime's result shapes
(the kernel must write into and return those very arrays).
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import onnx
import pytest
from onnx import helper

ort = pytest.importorskip("onnxruntime")

import workbench.ops.contrib  # noqa: E402,F401  (registers the kernels)
from workbench.ops.registry import NodeInfo, find_native  # noqa: E402

MS = "com.microsoft"


# --- harness -----------------------------------------------------------------------------


def _make_model(op, domain, opset, inputs, outputs, attrs):
    names = [n if a is not None else "" for n, a in inputs]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, list(outputs), domain=domain, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in inputs if a is not None]
    graph_outputs = [onnx.ValueInfoProto(name=o) for o in outputs if o]
    graph = helper.make_graph([node], "one_node", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid("", opset if not domain else 23), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets), node


def _session(model):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_ort(op, domain, opset, inputs, outputs, attrs):
    model, node = _make_model(op, domain, opset, inputs, outputs, attrs)
    got = _session(model).run(None, {n: a for n, a in inputs if a is not None})
    results, it = [], iter(got)
    for o in outputs:
        results.append(next(it) if o else None)
    return results, node


def build_kernel(node, opset, inputs, outputs, out_dtypes, out_shapes=(), constants=None):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    info = NodeInfo(
        name=node.name or node.op_type, op_type=node.op_type, domain=node.domain, opset=opset,
        attrs=attrs,
        input_dtypes=tuple(None if a is None else a.dtype for _, a in inputs),
        output_dtypes=tuple(out_dtypes),
        input_shapes=tuple(None if a is None else a.shape for _, a in inputs),
        output_shapes=tuple(out_shapes),
        output_used=tuple(bool(o) for o in outputs),
        constant_inputs=constants or {},
    )
    spec = find_native(info)
    assert spec is not None, f"no native kernel for {node.domain}::{node.op_type}-{opset}"
    return spec, spec.build(info)


def check(op, domain, inputs, outputs, attrs, *, opset=23, rtol=1e-5, atol=1e-5,
          compare=None, constants=None):
    """Run onnxruntime and the kernel (fresh and preallocated outputs); compare all outputs."""
    expected, node = run_ort(op, domain, opset, inputs, outputs, attrs)
    out_dtypes = [None if e is None else e.dtype for e in expected]
    _, fn = build_kernel(node, opset, inputs, outputs, out_dtypes,
                         [None if e is None else e.shape for e in expected], constants)
    arrays = [a for _, a in inputs]
    compare = compare or (lambda i, got, exp: np.testing.assert_allclose(
        got.astype(np.float64), exp.astype(np.float64), rtol=rtol, atol=atol,
        err_msg=f"output {i} ({outputs[i]})"))
    fresh = fn(list(arrays), [None] * len(outputs))
    for i, exp in enumerate(expected):
        if exp is None:
            continue
        assert fresh[i].shape == exp.shape, (i, fresh[i].shape, exp.shape)
        assert fresh[i].dtype == exp.dtype, (i, fresh[i].dtype, exp.dtype)
        compare(i, fresh[i], exp)
    outs = [None if e is None else np.full(e.shape, np.nan, e.dtype) if e.dtype.kind == "f"
            else np.empty_like(e) for e in expected]
    pre = fn(list(arrays), list(outs))
    for i, exp in enumerate(expected):
        if exp is None:
            continue
        assert pre[i] is outs[i], f"output {i} was not written into the preallocated array"
        compare(i, pre[i], exp)
    return expected, fresh


def rng_for(*key):
    """A generator seeded from the test's parameters (stable across processes)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# --- FastGelu / QuickGelu ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu(dtype, with_bias):
    r = rng_for("fastgelu", dtype, with_bias)
    x = (r.standard_normal((2, 5, 24)) * 3).astype(dtype)
    bias = r.standard_normal(24).astype(dtype) if with_bias else None
    tol = dict(rtol=1e-5, atol=1e-5) if dtype != np.float16 else dict(rtol=2e-3, atol=2e-3)
    check("FastGelu", MS, [("x", x), ("bias", bias)], ["y"], {}, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("alpha", [1.702, 1.0, -0.5])
def test_quick_gelu(dtype, alpha):
    r = rng_for("quickgelu", dtype, alpha)
    x = (r.standard_normal((3, 40)) * 6).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype != np.float16 else dict(rtol=2e-3, atol=2e-3)
    check("QuickGelu", MS, [("x", x)], ["y"], {"alpha": alpha}, **tol)


# --- SkipLayerNormalization / SkipSimplifiedLayerNormalization --------------------------------


@pytest.mark.parametrize("simplified", [False, True])
@pytest.mark.parametrize("skip_shape", ["full", "broadcast3", "broadcast2"])
@pytest.mark.parametrize("extras", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("outputs", [("y",), ("y", "mean", "inv", "sum"), ("y", "", "", "sum")])
def test_skip_layer_norm(simplified, skip_shape, extras, outputs):
    with_bias, with_beta = extras
    r = rng_for("sln", simplified, skip_shape, extras, outputs)
    b, s, h = 2, 3, 64
    x = r.standard_normal((b, s, h)).astype(np.float32)
    skip = {"full": (b, s, h), "broadcast3": (1, s, h), "broadcast2": (s, h)}[skip_shape]
    skip = r.standard_normal(skip).astype(np.float32)
    gamma = r.standard_normal(h).astype(np.float32)
    beta = r.standard_normal(h).astype(np.float32) if with_beta else None
    bias = r.standard_normal(h).astype(np.float32) if with_bias else None
    if simplified:
        op, inputs = "SkipSimplifiedLayerNormalization", [("x", x), ("skip", skip), ("gamma", gamma),
                                                           ("bias", bias)]
    else:
        op, inputs = "SkipLayerNormalization", [("x", x), ("skip", skip), ("gamma", gamma),
                                                ("beta", beta), ("bias", bias)]
    check(op, MS, inputs, list(outputs), {"epsilon": 1e-5}, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("sum_into", ["own", "x", "skip"])
@pytest.mark.parametrize("outputs", [("y", "", "", "sum"), ("y", "mean", "inv", "sum")])
def test_skip_simplified_layer_norm_one_row_on_stable_buffers(sum_into, outputs):
    """Decode's pattern: one row, the same input and output arrays every run (the sum
    output perhaps x's or skip's own buffer, as an in-place plan lends it), new contents
    each time; eight runs, each against onnxruntime."""
    r = rng_for("sln_stable", sum_into, outputs)
    x, skip = np.empty((1, 1, 576), np.float32), np.empty((1, 1, 576), np.float32)
    gamma = r.standard_normal(576).astype(np.float32)
    inputs = [("x", x), ("skip", skip), ("gamma", gamma)]
    x[...], skip[...] = r.standard_normal((2, 1, 1, 576))
    expected, node = run_ort("SkipSimplifiedLayerNormalization", MS, 1, [(n, a.copy()) for n, a in inputs],
                             list(outputs), {"epsilon": 1e-6})
    _, fn = build_kernel(node, 1, inputs, outputs, [None if e is None else e.dtype for e in expected],
                         [None if e is None else e.shape for e in expected])
    outs = [None if e is None else np.empty_like(e) for e in expected]
    outs[3] = {"own": outs[3], "x": x, "skip": skip}[sum_into]
    for run in range(8):
        x[...], skip[...] = r.standard_normal((2, 1, 1, 576))
        feeds = [(n, a.copy()) for n, a in inputs]
        want, _ = run_ort("SkipSimplifiedLayerNormalization", MS, 1, feeds, list(outputs), {"epsilon": 1e-6})
        got = fn([x, skip, gamma], list(outs))
        for i, (g, w) in enumerate(zip(got, want)):
            if w is None:
                continue
            assert g is outs[i]
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5, err_msg=f"run {run} output {outputs[i]}")


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_layer_norm_fp16_and_2d(op):
    r = rng_for("sln16", op)
    x = r.standard_normal((7, 32)).astype(np.float16)
    skip = r.standard_normal((7, 32)).astype(np.float16)
    gamma = r.standard_normal(32).astype(np.float16)
    check(op, MS, [("x", x), ("skip", skip), ("gamma", gamma)], ["y", "mean", "inv", "sum"], {},
          rtol=2e-3, atol=2e-3)


# --- MatMulNBits -------------------------------------------------------------------------


def _pack(values, bits):
    """Pack ints [..., n] low-bits-first into uint8 [..., ceil(n * bits / 8)]."""
    per = 8 // bits
    n = values.shape[-1]
    pad = (-n) % per
    v = np.concatenate([values, np.zeros(values.shape[:-1] + (pad,), values.dtype)], axis=-1)
    v = v.reshape(values.shape[:-1] + (-1, per)).astype(np.uint8)
    packed = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        packed |= (v[..., i] << (bits * i)).astype(np.uint8)
    return packed


def _nbits_inputs(r, bits, block_size, K, N, zp_kind, m=3, dtype=np.float32, g_idx=None,
                  with_bias=False):
    k_blocks = -(-K // block_size)
    q = r.integers(0, 2**bits, (N, k_blocks * block_size))
    b = _pack(q.reshape(N, k_blocks, block_size), bits)
    scales = (r.random((N, k_blocks)) * 0.05 + 0.005).astype(dtype)
    zp = None
    if zp_kind == "uint8":
        zp = _pack(r.integers(0, 2**bits, (N, k_blocks)), bits).reshape(-1)
    elif zp_kind == "float":
        zp = (r.random((N, k_blocks)) * 2**bits).astype(dtype).reshape(-1)
    a = r.standard_normal((m, K)).astype(dtype)
    bias = r.standard_normal(N).astype(dtype) if with_bias else None
    return [("A", a), ("B", b), ("scales", scales.reshape(-1)), ("zero_points", zp),
            ("g_idx", g_idx), ("bias", bias)]


NBITS_CASES = [
    (bits, bs, K, zp)
    for bits, bs in itertools.product((4, 8), (16, 32, 64, 128, 256))
    for K, zp in ((2 * bs, "none"), (2 * bs + 5, "uint8"), (3 * bs - 7, "float" if bits == 4 else "none"))
]


@pytest.mark.parametrize("bits,block_size,K,zp_kind", NBITS_CASES)
def test_matmul_nbits(bits, block_size, K, zp_kind):
    r = rng_for("nbits", bits, block_size, K, zp_kind)
    N = 24
    inputs = _nbits_inputs(r, bits, block_size, K, N, zp_kind, with_bias=(K % 2 == 1))
    attrs = dict(K=K, N=N, bits=bits, block_size=block_size)
    scale = max(1.0, float(np.sqrt(K)))
    check("MatMulNBits", MS, inputs, ["Y"], attrs, rtol=1e-4, atol=1e-5 * scale * 2**bits / 16)


@pytest.mark.parametrize("zp_kind", ["none", "uint8", "float"])
def test_matmul_nbits_g_idx(zp_kind):
    # onnxruntime honours g_idx; with g_idx it ignores packed uint8 zero points
    r = rng_for("nbits_gidx", zp_kind)
    K, N, bs = 96, 8, 32
    g_idx = r.integers(0, K // bs, K).astype(np.int32)
    inputs = _nbits_inputs(r, 4, bs, K, N, zp_kind, g_idx=g_idx, m=2)
    check("MatMulNBits", MS, inputs, ["Y"], dict(K=K, N=N, bits=4, block_size=bs), atol=1e-5)


def test_matmul_nbits_2bit_3d_fp16_and_constant_weights():
    r = rng_for("nbits_misc")
    K, N, bs = 80, 16, 16
    inputs = _nbits_inputs(r, 2, bs, K, N, "uint8", with_bias=True)
    inputs[0] = ("A", r.standard_normal((2, 3, K)).astype(np.float32))
    attrs = dict(K=K, N=N, bits=2, block_size=bs)
    check("MatMulNBits", MS, inputs, ["Y"], attrs, atol=1e-5)
    # dequantized once at build time when B/scales/zero_points are initializers
    check("MatMulNBits", MS, inputs, ["Y"], attrs, atol=1e-5,
          constants={1: inputs[1][1], 2: inputs[2][1], 3: inputs[3][1]})
    half = [(n, a.astype(np.float16) if a is not None and a.dtype == np.float32 else a)
            for n, a in _nbits_inputs(r, 4, 32, 64, N, "float", with_bias=True)]
    check("MatMulNBits", MS, half, ["Y"], dict(K=64, N=N, bits=4, block_size=32),
          rtol=5e-3, atol=5e-3)


def test_matmul_nbits_empty_weight():
    r = rng_for("nbits_empty")
    a = r.standard_normal((2, 64)).astype(np.float32)
    bias = r.standard_normal(5).astype(np.float32)
    inputs = [("A", a), ("B", np.zeros((0, 2, 16), np.uint8)), ("scales", np.zeros(0, np.float32)),
              ("zero_points", None), ("g_idx", None), ("bias", bias)]
    check("MatMulNBits", MS, inputs, ["Y"], dict(K=64, N=5, bits=4, block_size=32))


# --- RotaryEmbedding (com.microsoft) ----------------------------------------------------------


def _cos_sin(max_pos, half, dtype=np.float32, base=10000.0):
    inv = 1.0 / base ** (np.arange(half) / half)
    ang = np.arange(max_pos)[:, None] * inv[None]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


MS_ROTARY_CASES = list(itertools.product(
    ["3d", "4d"], [False, True], ["offset", "matrix"], ["full", "partial"]))


@pytest.mark.parametrize("layout,interleaved,pos_kind,rot", MS_ROTARY_CASES)
def test_ms_rotary_embedding(layout, interleaved, pos_kind, rot):
    r = rng_for("msrot", layout, interleaved, pos_kind, rot)
    b, s, n, h = 2, 5, 3, 32
    rot_dim = h if rot == "full" else 16
    x = r.standard_normal((b, s, n * h) if layout == "3d" else (b, n, s, h)).astype(np.float32)
    cos, sin = _cos_sin(20, rot_dim // 2)
    pos = (np.array([4], np.int64) if pos_kind == "offset"
           else r.integers(0, 20, (b, s)).astype(np.int64))
    attrs = dict(interleaved=int(interleaved))
    if rot == "partial":
        attrs.update(rotary_embedding_dim=rot_dim, num_heads=n)
    check("RotaryEmbedding", MS, [("x", x), ("pos", pos), ("cos", cos), ("sin", sin)], ["y"], attrs,
          rtol=1e-5, atol=1e-5)


def test_ms_rotary_embedding_fp16():
    r = rng_for("msrot16")
    x = r.standard_normal((1, 4, 2 * 16)).astype(np.float16)
    cos, sin = _cos_sin(8, 8, np.float16)
    check("RotaryEmbedding", MS, [("x", x), ("pos", np.array(2, np.int64)), ("cos", cos), ("sin", sin)],
          ["y"], {}, rtol=1e-3, atol=1e-3)


# --- RotaryEmbedding-23 (also against onnx.reference) --------------------------------------


def _reference(op, opset, inputs, outputs, attrs):
    from onnx.reference import ReferenceEvaluator

    model, _ = _make_model(op, "", opset, inputs, outputs, attrs)
    got = ReferenceEvaluator(model).run(None, {n: a for n, a in inputs if a is not None})
    it = iter(got)
    return [next(it) if o else None for o in outputs]


ROTARY23_CASES = list(itertools.product(["3d", "4d"], [False, True], [True, False], ["full", "partial"]))


@pytest.mark.parametrize("layout,interleaved,with_pos,rot", ROTARY23_CASES)
def test_rotary_embedding_23(layout, interleaved, with_pos, rot):
    r = rng_for("rot23", layout, interleaved, with_pos, rot)
    b, s, n, h = 2, 4, 2, 16
    rot_dim = h if rot == "full" else 8
    x = r.standard_normal((b, s, n * h) if layout == "3d" else (b, n, s, h)).astype(np.float32)
    cos, sin = _cos_sin(12, rot_dim // 2)
    if with_pos:
        pos = r.integers(0, 12, (b, s)).astype(np.int64)
        inputs = [("x", x), ("cos", cos), ("sin", sin), ("pos", pos)]
    else:
        pos = r.integers(0, 12, (b, s))
        inputs = [("x", x), ("cos", cos[pos]), ("sin", sin[pos])]
    attrs = dict(interleaved=int(interleaved))
    if layout == "3d":
        attrs["num_heads"] = n
    if rot == "partial":
        attrs["rotary_embedding_dim"] = rot_dim
    _, fresh = check("RotaryEmbedding", "", inputs, ["y"], attrs, opset=23)
    ref = _reference("RotaryEmbedding", 23, inputs, ["y"], attrs)
    np.testing.assert_allclose(fresh[0], ref[0], rtol=1e-5, atol=1e-6)


# --- Attention-23 (also against onnx.reference) --------------------------------------------


ATTN_CASES = [
    # layout, (q_heads, kv_heads), is_causal, mask, past, softcap, mode
    ("4d", (2, 2), 0, None, 0, 0.0, 0),
    ("4d", (2, 2), 1, None, 0, 0.0, 3),
    ("4d", (4, 2), 1, None, 3, 0.0, 1),
    ("4d", (4, 2), 0, "bool", 3, 0.0, 2),
    ("4d", (4, 1), 1, "float", 2, 0.0, 2),
    ("4d", (2, 2), 1, "bool4d", 2, 5.0, 2),
    ("4d", (2, 2), 0, "float4d", 0, 5.0, 1),
    ("3d", (4, 2), 1, None, 0, 0.0, 0),
    ("3d", (4, 2), 0, "bool", 2, 0.0, 3),
    ("3d", (6, 3), 1, "float", 2, 8.0, 2),
    ("3d", (2, 2), 0, None, 4, 8.0, 0),
    ("4d", (2, 2), 1, "bool_allmasked", 0, 0.0, 3),
    ("4d", (2, 2), 0, "float_neginf", 0, 0.0, 2),
    ("3d", (4, 2), 1, "float_neginf", 2, 3.0, 3),
]


@pytest.mark.parametrize("layout,heads,is_causal,mask_kind,past,softcap,mode", ATTN_CASES)
def test_attention_23(layout, heads, is_causal, mask_kind, past, softcap, mode):
    r = rng_for("attn", layout, heads, is_causal, mask_kind, past, softcap, mode)
    b, s, kv_len, h = 2, 3, 4 if not is_causal else 3, 8
    nq, nkv = heads
    total = past + kv_len

    def t(*shape):
        return r.standard_normal(shape).astype(np.float32)

    if layout == "4d":
        q, k, v = t(b, nq, s, h), t(b, nkv, kv_len, h), t(b, nkv, kv_len, h)
    else:
        q, k, v = t(b, s, nq * h), t(b, kv_len, nkv * h), t(b, kv_len, nkv * h)
    mask = None
    if mask_kind == "bool":
        mask = r.random((s, total)) > 0.3
    elif mask_kind == "bool4d":
        mask = r.random((b, 1, s, total)) > 0.3
    elif mask_kind == "bool_allmasked":
        mask = r.random((b, nq, s, total)) > 0.3
        mask[0, :, 1] = False
    elif mask_kind == "float":
        mask = t(s, total)
    elif mask_kind == "float4d":
        mask = t(1, nq, s, total)
    elif mask_kind == "float_neginf":  # -inf entries and a fully masked row
        mask = t(s, total)
        mask[0, 1] = mask[2, :] = -np.inf
    pk = pv = None
    if past:
        pk, pv = t(b, nkv, past, h), t(b, nkv, past, h)
    attrs = dict(is_causal=is_causal, qk_matmul_output_mode=mode)
    if softcap:
        attrs["softcap"] = softcap
    if layout == "3d":
        attrs.update(q_num_heads=nq, kv_num_heads=nkv)
    if mask_kind == "float" and mode == 2:
        attrs["scale"] = 0.3
    inputs = [("Q", q), ("K", k), ("V", v), ("mask", mask), ("pk", pk), ("pv", pv)]
    outputs = ["Y", "present_key" if past else "", "present_value" if past else "", "qk"]
    def compare(i, got, exp):
        if i == 3 and mode == 2:  # onnxruntime writes float32's lowest where ONNX has -inf
            exp = np.where(exp == np.finfo(np.float32).min, -np.inf, exp)
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")

    _, fresh = check("Attention", "", inputs, outputs, attrs, opset=23, compare=compare)
    # onnx.reference agrees on Y / present, and on qk_matmul_output except mode 0 with softcap
    # (it returns the softcapped product there; onnxruntime and the ONNX spec the raw one)
    ref = _reference("Attention", 23, inputs, outputs, attrs)
    for i in (0, 1, 2, 3):
        if ref[i] is not None and not (i == 3 and mode == 0 and softcap):
            np.testing.assert_allclose(fresh[i], ref[i], rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


@pytest.mark.parametrize("opset,attrs", [
    (24, dict()), (24, dict(is_causal=1)),
    (25, dict(is_causal=1, left_window_size=1)), (25, dict(left_window_size=1, right_window_size=0)),
])
def test_attention_nonpad_and_windows(opset, attrs):
    r = rng_for("attn24", opset, str(attrs))
    b, n, s, t, h = 2, 2, 3, 5, 8
    q = r.standard_normal((b, n, s, h)).astype(np.float32)
    k = r.standard_normal((b, n, t, h)).astype(np.float32)
    v = r.standard_normal((b, n, t, h)).astype(np.float32)
    inputs = [("Q", q), ("K", k), ("V", v)]
    if opset == 24:
        inputs += [("m", None), ("pk", None), ("pv", None), ("nonpad", np.array([5, 3], np.int64))]
    _, fresh = check("Attention", "", inputs, ["Y"], attrs, opset=opset)
    ref = _reference("Attention", opset, inputs, ["Y"], attrs)
    np.testing.assert_allclose(fresh[0], ref[0], rtol=1e-5, atol=1e-5)


def test_attention_short_mask_matches_reference():
    # an attn_mask shorter than the keys: the missing columns are masked (onnx.reference;
    # onnxruntime rejects such a mask)
    r = rng_for("attn_short_mask")
    q, k, v = (r.standard_normal((2, 2, 3, 8)).astype(np.float32) for _ in range(3))
    k, v = np.concatenate([k, k[:, :, :2]], axis=2), np.concatenate([v, v[:, :, :2]], axis=2)
    for mask in (r.random((2, 1, 3, 3)) > 0.2, r.standard_normal((3, 4)).astype(np.float32)):
        inputs = [("Q", q), ("K", k), ("V", v), ("mask", mask)]
        model, node = _make_model("Attention", "", 23, inputs, ["Y"], {})
        _, fn = build_kernel(node, 23, inputs, ["Y"], [np.dtype(np.float32)])
        got = fn([a for _, a in inputs], [None])
        ref = _reference("Attention", 23, inputs, ["Y"], {})
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_attention_other_dtypes(dtype):
    r = rng_for("attn_dt", dtype)
    q, k, v = (r.standard_normal((1, 2, 4, 16)).astype(dtype) for _ in range(3))
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check("Attention", "", [("Q", q), ("K", k), ("V", v)], ["Y"], dict(is_causal=1), rtol=tol, atol=tol)


# --- GroupQueryAttention ------------------------------------------------------------------

GQA_INPUT_NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
                   "total_sequence_length", "cos_cache", "sin_cache", "position_ids",
                   "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
                   "k_norm_weight", "query_seqlens"]
GQA_OUTPUTS = ["output", "present_key", "present_value"]


def run_ort_gqa(inputs, attrs, outputs=GQA_OUTPUTS, share_buffer=False):
    """onnxruntime's result; with share_buffer, present_* are bound to the past_* buffers."""
    model, node = _make_model("GroupQueryAttention", MS, 23, inputs, outputs, attrs)
    sess = _session(model)
    feeds = {n: a for n, a in inputs if a is not None}
    if not share_buffer:
        got = iter(sess.run(None, feeds))
        return [next(got) if o else None for o in outputs], node
    binding = sess.io_binding()
    shared, keep_alive = {}, []  # an OrtValue made from numpy borrows the numpy buffer
    for name, arr in feeds.items():
        if name in ("past_key", "past_value"):
            keep_alive.append(arr.copy())
            shared[name] = ort.OrtValue.ortvalue_from_numpy(keep_alive[-1])
            binding.bind_ortvalue_input(name, shared[name])
        else:
            binding.bind_cpu_input(name, arr)
    binding.bind_output(outputs[0], "cpu")
    binding.bind_ortvalue_output(outputs[1], shared["past_key"])
    binding.bind_ortvalue_output(outputs[2], shared["past_value"])
    sess.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()[0]
    return [out, shared["past_key"].numpy().copy(), shared["past_value"].numpy().copy()], node


def make_gqa_inputs(r, *, batch, seq, num_heads, kv_heads, head_size, seqlens, past_cap,
                    packed=False, rotary=None, rot_dim=None, dtype=np.float32,
                    position_ids=None, attention_bias=False, head_sink=False,
                    query_seqlens=None, total=None, max_pos=64):
    def t(*shape):
        return r.standard_normal(shape).astype(dtype)

    q_hidden, kv_hidden = num_heads * head_size, kv_heads * head_size
    seqlens = np.asarray(seqlens, np.int32)
    total = int(seqlens.max()) + 1 if total is None else total
    if packed:
        query, key, value = t(batch, seq, q_hidden + 2 * kv_hidden), None, None
    else:
        query, key, value = t(batch, seq, q_hidden), t(batch, seq, kv_hidden), t(batch, seq, kv_hidden)
    past_key = past_value = None
    if past_cap is not None:
        past_key, past_value = t(batch, kv_heads, past_cap, head_size), t(batch, kv_heads, past_cap, head_size)
    cos = sin = None
    if rotary:
        cos, sin = _cos_sin(max_pos, (rot_dim or head_size) // 2, dtype)
    bias = t(batch, 1 if attention_bias == "bcast" else num_heads, seq, total) if attention_bias else None
    sink = t(num_heads) if head_sink else None
    return [("query", query), ("key", key), ("value", value), ("past_key", past_key),
            ("past_value", past_value), ("seqlens_k", seqlens),
            ("total_sequence_length", np.array(total, np.int32)), ("cos_cache", cos),
            ("sin_cache", sin), ("position_ids", position_ids), ("attention_bias", bias),
            ("head_sink", sink), ("k_scale", None), ("v_scale", None), ("q_norm_weight", None),
            ("k_norm_weight", None),
            ("query_seqlens", None if query_seqlens is None else np.asarray(query_seqlens, np.int32))]


def check_gqa(inputs, attrs, *, share_buffer=False, valid_rows=None, rtol=1e-5, atol=1e-5,
              outputs=GQA_OUTPUTS, compare_present=True):
    """Compare output (rows s < valid_rows[b] only, when given) and present_key/value."""
    expected, node = run_ort_gqa(inputs, attrs, outputs, share_buffer)
    out_dtypes = [None if e is None else e.dtype for e in expected]
    _, fn = build_kernel(node, 1, inputs, outputs, out_dtypes,
                         [None if e is None else e.shape for e in expected])
    arrays = [a for _, a in inputs]

    def compare(results, label):
        for i, exp in enumerate(expected):
            if exp is None or (i in (1, 2) and not compare_present):
                continue
            got = results[i]
            assert got.shape == exp.shape and got.dtype == exp.dtype, (label, i, got.shape, exp.shape)
            if i == 0 and valid_rows is not None:
                for b, n in enumerate(valid_rows):
                    np.testing.assert_allclose(got[b, :n].astype(np.float64), exp[b, :n].astype(np.float64),
                                               rtol=rtol, atol=atol, err_msg=f"{label} output batch {b}")
            else:
                np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=rtol,
                                           atol=atol, err_msg=f"{label} output {i}")

    if not share_buffer:
        compare(fn(list(arrays), [None] * len(outputs)), "fresh")
        outs = [None if e is None else np.full(e.shape, np.nan, e.dtype) for e in expected]
    else:
        # the executor's shared KV buffer: present_* are the very arrays given as past_*
        arrays = [a.copy() if a is not None else None for a in arrays]
        outs = [np.full(expected[0].shape, np.nan, expected[0].dtype), arrays[3], arrays[4]]
    got = fn(list(arrays), list(outs))
    for i, o in enumerate(outs):
        if o is not None:
            assert got[i] is o, f"output {i} was not written into the preallocated array"
    compare(got, "preallocated")
    return expected, got


HEADS = [(4, 4), (4, 2), (8, 2)]
ROTARY = [None, "plain", "interleaved"]
PHASES = ["prompt", "prompt_capacity", "token", "shared", "continued_prompt"]


def _gqa_sweep():
    """phase x heads x rotary x head_size x local_window in full; batch, softcap and
    packed QKV cycle through the product so every combination of those pairs appears."""
    cases = []
    grid = itertools.product(PHASES, HEADS, ROTARY, (16, 32, 64), (-1, 3))
    for i, (phase, heads, rotary, head_size, local_window) in enumerate(grid):
        batch = 1 if phase == "continued_prompt" else (1, 2)[(i // 2) % 2]
        softcap = (0.0, 30.0)[(i + i // 4) % 2]
        packed = bool((i // 2 + i // 8) % 2)
        cases.append((phase, heads, rotary, head_size, batch, local_window, softcap, packed))
    return cases


@pytest.mark.parametrize("phase,heads,rotary,head_size,batch,local_window,softcap,packed", _gqa_sweep())
def test_group_query_attention(phase, heads, rotary, head_size, batch, local_window, softcap, packed):
    r = rng_for("gqa", phase, heads, rotary, head_size, batch, local_window, softcap, packed)
    num_heads, kv_heads = heads
    valid_rows = None
    if phase == "prompt":  # no past; batch entry 1 right-padded. Its padded query rows are
        # unspecified (onnxruntime's window softmax there reads unwritten score columns)
        seq, past_cap = 6, None
        seqlens = [5, 3][:batch]
        valid_rows = [s + 1 for s in seqlens]
    elif phase == "prompt_capacity":  # first prompt into past/present buffers of capacity 12
        seq, past_cap = 5, 12
        seqlens = [4, 4][:batch]
    elif phase == "token":  # past buffers of exactly the past length, ragged per batch
        seq, past_cap = 1, 7
        seqlens = [7, 5][:batch]
    elif phase == "shared":  # one buffer of capacity 16 for past and present
        seq, past_cap = 1, 16
        seqlens = [9, 4][:batch]
    else:  # a second prompt chunk after a past (batch 1 only)
        seq, past_cap = 3, 6
        seqlens = [8]
    inputs = make_gqa_inputs(r, batch=batch, seq=seq, num_heads=num_heads, kv_heads=kv_heads,
                             head_size=head_size, seqlens=seqlens, past_cap=past_cap,
                             packed=packed, rotary=rotary)
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_heads, local_window_size=local_window)
    if softcap:
        attrs["softcap"] = softcap
    if rotary:
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
    check_gqa(inputs, attrs, share_buffer=(phase == "shared"), valid_rows=valid_rows)


GQA_FEATURES = {
    # name: (phase, extra make_gqa_inputs kwargs, extra attrs)
    "position_ids_token": ("token", dict(position_ids="random", rotary="plain"), dict(do_rotary=1)),
    "position_ids_prompt": ("prompt", dict(position_ids="random", rotary="interleaved"),
                            dict(do_rotary=1, rotary_interleaved=1)),
    "partial_rotary": ("token", dict(rotary="plain", rot_dim=16), dict(do_rotary=1)),
    "attention_bias": ("token", dict(attention_bias=True), dict(softcap=20.0)),
    "attention_bias_prompt": ("prompt", dict(attention_bias="bcast"), dict(local_window_size=2)),
    "head_sink": ("token", dict(head_sink=True), dict()),
    "head_sink_prompt": ("prompt", dict(head_sink=True), dict(local_window_size=3)),
    "smooth_softmax": ("prompt", dict(), dict(smooth_softmax=1)),
    "scale": ("token", dict(), dict(scale=0.05)),
    "not_causal": ("prompt", dict(), dict(causal=0)),
    "query_seqlens": ("chunk", dict(query_seqlens=[3, 1]), dict()),
    "query_seqlens_rotary": ("chunk", dict(query_seqlens=[2, 3], rotary="plain"), dict(do_rotary=1)),
    "query_seqlens_unshared": ("chunk_unshared", dict(query_seqlens=[3, 2]), dict()),
}


@pytest.mark.parametrize("feature", sorted(GQA_FEATURES))
def test_group_query_attention_features(feature):
    phase, extra, extra_attrs = GQA_FEATURES[feature]
    r = rng_for("gqa_feature", feature)
    batch, num_heads, kv_heads, head_size = 2, 4, 2, 32
    valid_rows = None
    total = None
    if phase == "prompt":
        seq, past_cap, seqlens = 5, None, [4, 4]
    elif phase == "token":
        seq, past_cap, seqlens = 1, 6, [6, 3]
    else:  # chunked prefill into a fixed-capacity cache, rows right-padded per batch (valid rows:
        # query_seqlens[b]; the rest is unspecified, and so are cache rows >= T_b when not shared)
        seq, past_cap, seqlens, total = 3, 12, [7, 4], 12
        valid_rows = extra["query_seqlens"]
    if extra.get("position_ids") == "random":
        extra = dict(extra, position_ids=r.integers(0, 40, (batch, seq)).astype(np.int64))
    inputs = make_gqa_inputs(r, batch=batch, seq=seq, num_heads=num_heads, kv_heads=kv_heads,
                             head_size=head_size, seqlens=seqlens, past_cap=past_cap, total=total,
                             **extra)
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_heads, **extra_attrs)
    check_gqa(inputs, attrs, valid_rows=valid_rows, share_buffer=(phase == "chunk"))


@pytest.mark.parametrize("phase", ["prompt", "token"])
def test_group_query_attention_fp16(phase):
    r = rng_for("gqa16", phase)
    seq, cap, seqlens = (5, None, [4, 2]) if phase == "prompt" else (1, 6, [6, 3])
    inputs = make_gqa_inputs(r, batch=2, seq=seq, num_heads=4, kv_heads=2, head_size=32,
                             seqlens=seqlens, past_cap=cap, dtype=np.float16, rotary="plain")
    check_gqa(inputs, dict(num_heads=4, kv_num_heads=2, do_rotary=1, local_window_size=3),
              valid_rows=[5, 3] if phase == "prompt" else None, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("qk_output", [1, 2])
@pytest.mark.parametrize("phase", ["prompt", "token"])
def test_group_query_attention_qk_output(qk_output, phase):
    r = rng_for("gqa_qk", qk_output, phase)
    seq, cap, seqlens = (5, None, [4, 4]) if phase == "prompt" else (1, 6, [6, 3])
    inputs = make_gqa_inputs(r, batch=2, seq=seq, num_heads=4, kv_heads=2, head_size=16,
                             seqlens=seqlens, past_cap=cap)
    check_gqa(inputs, dict(num_heads=4, kv_num_heads=2, qk_output=qk_output, softcap=5.0),
              outputs=GQA_OUTPUTS + ["output_qk"])


def test_group_query_attention_output_only():
    # without past, omitting present_key/value is well defined (onnxruntime's CPU kernel
    # then skips the past entirely, so with a past the two differ: see the module notes)
    r = rng_for("gqa_out_only")
    inputs = make_gqa_inputs(r, batch=2, seq=4, num_heads=8, kv_heads=2, head_size=16,
                             seqlens=[3, 3], past_cap=None, packed=True)
    check_gqa(inputs, dict(num_heads=8, kv_num_heads=2), outputs=["output", "", ""])


def test_group_query_attention_present_shape_and_capture():
    """present length = max(total_sequence_length, past length): from a preallocated output,
    an initializer, or (only then) a host read; the capture verdict says which."""
    from workbench.ops.registry import CaptureVerdict

    r = rng_for("gqa_shape")
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=4, kv_heads=2, head_size=16,
                             seqlens=[5], past_cap=5)
    expected, node = run_ort_gqa(inputs, dict(num_heads=4, kv_num_heads=2))
    assert expected[1].shape == (1, 2, 6, 16)
    out_dtypes = [e.dtype for e in expected]

    def verdict(out_shapes, constants=None):
        spec, fn = build_kernel(node, 1, inputs, GQA_OUTPUTS, out_dtypes, out_shapes, constants)
        v = spec.capture_verdict(build_info(node, inputs, out_dtypes, out_shapes, constants))
        assert isinstance(v, CaptureVerdict)
        return v, fn

    symbolic = [("batch", "seq", 64), ("batch", 2, "total", 16), ("batch", 2, "total", 16)]
    v, fn = verdict(symbolic)
    assert v.supported
    v, fn = verdict([None, None, None])
    assert not v.supported and v.reason == "host_read"
    v, fn = verdict([None, None, None], {6: inputs[6][1]})
    assert v.supported
    got = fn([a for _, a in inputs], [None, None, None])  # the initializer sizes present
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)


def build_info(node, inputs, out_dtypes, out_shapes, constants=None):
    return NodeInfo(
        name=node.op_type, op_type=node.op_type, domain=node.domain, opset=1,
        attrs={a.name: helper.get_attribute_value(a) for a in node.attribute},
        input_dtypes=tuple(None if a is None else a.dtype for _, a in inputs),
        output_dtypes=tuple(out_dtypes), output_shapes=tuple(out_shapes),
        output_used=tuple(True for _ in out_dtypes), constant_inputs=constants or {})


# --- GroupQueryAttention: the one-token decode fast path ---------------------------------

DECODE_LAYOUTS = {
    # name: (past capacity, position, share_buffer): the shared KV buffer of capacity 256;
    # a separate present of the past's capacity; a past of exactly pos rows (present pos + 1)
    "shared": (256, 100, True),
    "shared_first": (8, 0, True),
    "capacity": (16, 9, False),
    "exact": (11, 11, False),
}


def _general_path_forbidden(monkeypatch):
    """Make GroupQueryAttention's general path fail, so a run that succeeds took the fast path."""
    import workbench.ops.group_query_attention as ca

    def boom(*args, **kwargs):
        raise AssertionError("GroupQueryAttention took the general path")

    monkeypatch.setattr(ca, "_masked_softmax", boom)
    monkeypatch.setattr(ca, "attention_as_onnxruntime", boom)  # its float32 form as onnxruntime rounds it


def check_decode_paths(inputs, attrs, *, share_buffer, rtol=1e-6, atol=1e-6):
    """The fast path against the general one, on the same inputs (fresh and preallocated
    outputs; the shared case on copies of one past buffer each)."""
    import workbench.ops.group_query_attention as ca

    expected, node = run_ort_gqa(inputs, attrs, GQA_OUTPUTS, share_buffer)
    _, fn = build_kernel(node, 1, inputs, GQA_OUTPUTS, [e.dtype for e in expected],
                         [e.shape for e in expected])

    def run(fast, preallocated):
        arrays = [None if a is None else a.copy() for _, a in inputs]
        outs = [None, None, None]
        if preallocated:
            outs = [np.full(e.shape, np.nan, e.dtype) for e in expected]
            if share_buffer:
                outs[1:] = arrays[3], arrays[4]
        saved = ca.DECODE_FAST_PATH
        ca.DECODE_FAST_PATH = fast
        try:
            got = fn(arrays, list(outs))
        finally:
            ca.DECODE_FAST_PATH = saved
        for o, g in zip(outs, got, strict=True):
            assert o is None or g is o
        return got

    for preallocated in (False, True):
        general, fast = run(False, preallocated), run(True, preallocated)
        for i, (g, f) in enumerate(zip(general, fast, strict=True)):
            assert f.shape == g.shape and f.dtype == g.dtype
            np.testing.assert_allclose(f.astype(np.float64), g.astype(np.float64), rtol=rtol, atol=atol,
                                       err_msg=f"output {i}, preallocated={preallocated}")


DECODE_CASES = [(layout, heads, rotary, (i + j) % 2 == 1)
                for i, layout in enumerate(DECODE_LAYOUTS)
                for j, (heads, rotary) in enumerate(itertools.product([(9, 3), (4, 4)], ROTARY))]


@pytest.mark.parametrize("layout,heads,rotary,packed", DECODE_CASES)
def test_group_query_attention_decode_fast_path(monkeypatch, layout, heads, rotary, packed):
    """Batch 1, one new token (head size 64, GQA ratios 3 and 1): the fast path matches
    onnxruntime and the general path."""
    cap, pos, share = DECODE_LAYOUTS[layout]
    num_heads, kv_heads = heads
    r = rng_for("gqa_decode", layout, heads, rotary, packed)
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=num_heads, kv_heads=kv_heads, head_size=64,
                             seqlens=[pos], past_cap=cap, packed=packed, rotary=rotary, max_pos=300)
    attrs = dict(num_heads=num_heads, kv_num_heads=kv_heads, local_window_size=-1)
    if rotary:
        attrs.update(do_rotary=1, rotary_interleaved=int(rotary == "interleaved"))
    check_decode_paths(inputs, attrs, share_buffer=share)
    _general_path_forbidden(monkeypatch)
    check_gqa(inputs, attrs, share_buffer=share)


DECODE_FEATURES = {
    # name: (layout, extra make_gqa_inputs kwargs, extra attrs)
    "softcap": ("shared", dict(rotary="plain"), dict(do_rotary=1, softcap=20.0)),
    "window": ("shared", dict(rotary="interleaved"), dict(do_rotary=1, rotary_interleaved=1,
                                                          local_window_size=7)),
    "window_wider_than_past": ("exact", dict(), dict(local_window_size=40)),
    "attention_bias": ("exact", dict(attention_bias=True), dict(softcap=20.0)),
    "attention_bias_bcast": ("capacity", dict(attention_bias="bcast"), dict()),
    "head_sink": ("shared", dict(head_sink=True, rotary="plain"), dict(do_rotary=1)),
    "smooth_softmax": ("capacity", dict(), dict(smooth_softmax=1)),
    "scale": ("shared", dict(), dict(scale=0.05)),
    "position_ids": ("shared", dict(position_ids=np.array([[37]], np.int64), rotary="plain"),
                     dict(do_rotary=1)),
    "partial_rotary": ("exact", dict(rotary="interleaved", rot_dim=32),
                       dict(do_rotary=1, rotary_interleaved=1)),
    "partial_rotary_plain": ("shared", dict(rotary="plain", rot_dim=16), dict(do_rotary=1)),
    "not_causal": ("exact", dict(rotary="plain"), dict(do_rotary=1, causal=0)),
}


@pytest.mark.parametrize("feature", sorted(DECODE_FEATURES))
def test_group_query_attention_decode_fast_path_features(monkeypatch, feature):
    layout, extra, extra_attrs = DECODE_FEATURES[feature]
    cap, pos, share = DECODE_LAYOUTS[layout]
    r = rng_for("gqa_decode_feature", feature)
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=6, kv_heads=2, head_size=64, seqlens=[pos],
                             past_cap=cap, max_pos=300, **extra)
    attrs = dict(num_heads=6, kv_num_heads=2, **extra_attrs)
    check_decode_paths(inputs, attrs, share_buffer=share)
    _general_path_forbidden(monkeypatch)
    check_gqa(inputs, attrs, share_buffer=share)


@pytest.mark.parametrize("layout", ["shared", "exact"])
def test_group_query_attention_decode_fast_path_fp16(monkeypatch, layout):
    cap, pos, share = DECODE_LAYOUTS[layout]
    r = rng_for("gqa_decode16", layout)
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=9, kv_heads=3, head_size=64, seqlens=[pos],
                             past_cap=cap, dtype=np.float16, rotary="plain", max_pos=300)
    attrs = dict(num_heads=9, kv_num_heads=3, do_rotary=1)
    check_decode_paths(inputs, attrs, share_buffer=share, rtol=2e-3, atol=2e-3)
    _general_path_forbidden(monkeypatch)
    check_gqa(inputs, attrs, share_buffer=share, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("layout", ["exact", "capacity", "shared"])
def test_group_query_attention_decode_fast_path_on_stable_buffers(monkeypatch, layout):
    """The decode loop's pattern: the same input and output arrays every run, new
    contents each time (and a new position, but for "exact": a growing cache, whose
    present is the past plus the new row); eight runs, each against onnxruntime."""
    cap, first, share = DECODE_LAYOUTS[layout]
    r = rng_for("gqa_stable", layout)
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=9, kv_heads=3, head_size=64, seqlens=[first],
                             past_cap=cap, rotary="plain", max_pos=300)
    arrays = dict(inputs)
    attrs = dict(num_heads=9, kv_num_heads=3, do_rotary=1)
    expected, node = run_ort_gqa(inputs, attrs, GQA_OUTPUTS, share)
    _, fn = build_kernel(node, 1, inputs, GQA_OUTPUTS, [e.dtype for e in expected], [e.shape for e in expected])
    outs = [np.empty_like(e) for e in expected]
    if share:
        outs[1:] = arrays["past_key"], arrays["past_value"]
    _general_path_forbidden(monkeypatch)
    for run in range(8):
        pos = first if layout == "exact" else int(r.integers(0, cap))
        for name in ("query", "key", "value", "past_key", "past_value"):
            arrays[name][...] = r.standard_normal(arrays[name].shape)
        arrays["seqlens_k"][...] = pos
        arrays["total_sequence_length"][...] = pos + 1
        feeds = [(name, arrays[name] if a is not None else None) for name, a in inputs]
        want, _ = run_ort_gqa([(n, None if a is None else a.copy()) for n, a in feeds], attrs, GQA_OUTPUTS, share)
        got = fn([a for _, a in feeds], list(outs))
        for i, (g, w) in enumerate(zip(got, want)):
            assert g is outs[i]
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"run {run} output {i}")


def test_group_query_attention_decode_falls_back(monkeypatch):
    """Cases outside the fast path take the general path (batch 2, output_qk) and still
    match onnxruntime, as does a one-token chunk with query_seqlens."""
    _general_path_forbidden(monkeypatch)
    r = rng_for("gqa_decode_fallback")
    inputs = make_gqa_inputs(r, batch=2, seq=1, num_heads=4, kv_heads=2, head_size=16,
                             seqlens=[5, 3], past_cap=8)
    with pytest.raises(AssertionError, match="general path"):
        check_gqa(inputs, dict(num_heads=4, kv_num_heads=2), share_buffer=True)
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=4, kv_heads=2, head_size=16,
                             seqlens=[5], past_cap=8)
    with pytest.raises(AssertionError, match="general path"):
        check_gqa(inputs, dict(num_heads=4, kv_num_heads=2, qk_output=1),
                  outputs=GQA_OUTPUTS + ["output_qk"])
    monkeypatch.undo()
    check_gqa(inputs, dict(num_heads=4, kv_num_heads=2, qk_output=1), outputs=GQA_OUTPUTS + ["output_qk"])
    inputs = make_gqa_inputs(r, batch=1, seq=1, num_heads=4, kv_heads=2, head_size=16,
                             seqlens=[7], past_cap=8, query_seqlens=[1])
    check_gqa(inputs, dict(num_heads=4, kv_num_heads=2), share_buffer=True)


def test_bfloat16_kernels_follow_float32():
    """bfloat16 (no onnxruntime CPU kernel): the kernels widen to float32 and round once,
    so they match onnxruntime's float32 result on the same (bfloat16-exact) values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    r = rng_for("bf16")

    def exact(*shape):  # float32 values that bfloat16 holds exactly
        return r.standard_normal(shape).astype(bf16).astype(np.float32)

    def compare_bf16(op, domain, inputs, outputs, attrs, opset=23, atol=2e-2, float32_outputs=()):
        expected, node = run_ort(op, domain, opset, inputs, outputs, attrs)
        low = [(n, a.astype(bf16) if a is not None and a.dtype == np.float32 else a) for n, a in inputs]
        out_dtypes = [None if e is None else np.dtype(np.float32) if i in float32_outputs else bf16
                      for i, e in enumerate(expected)]
        _, fn = build_kernel(node, opset, low, outputs, out_dtypes)
        got = fn([a for _, a in low], [None] * len(outputs))
        for g, e, dt in zip(got, expected, out_dtypes, strict=True):
            if e is not None:
                assert g.dtype == dt
                np.testing.assert_allclose(g.astype(np.float32), e, rtol=2e-2, atol=atol)

    x, skip, gamma = exact(2, 3, 32), exact(2, 3, 32), exact(32)
    compare_bf16("SkipSimplifiedLayerNormalization", MS, [("x", x), ("s", skip), ("g", gamma)],
                 ["y", "", "inv", "sum"], {}, float32_outputs=(1, 2))
    cos, sin = _cos_sin(8, 8)
    compare_bf16("RotaryEmbedding", "", [("x", exact(1, 2, 4, 16)), ("cos", cos.astype(bf16).astype(np.float32)),
                                         ("sin", sin.astype(bf16).astype(np.float32)),
                                         ("pos", np.array([[0, 2, 4, 6]], np.int64))], ["y"], {})
    inputs = _nbits_inputs(r, 4, 32, 64, 8, "uint8")
    inputs = [(n, a.astype(bf16).astype(np.float32) if a is not None and a.dtype == np.float32 else a)
              for n, a in inputs]
    compare_bf16("MatMulNBits", MS, inputs, ["Y"], dict(K=64, N=8, bits=4, block_size=32), atol=5e-2)


def test_onnx_backend_cases_attention_and_rotary():
    """The ONNX conformance node cases of Attention / RotaryEmbedding, on the kernels directly
    (bfloat16 Attention cases are left to the onnx.reference fallback: no native kernel)."""
    from conformance import node_cases, to_python

    failures, ran = [], 0
    for case in node_cases():
        model = case.model
        node = model.graph.node[0]
        if node.op_type not in ("Attention", "RotaryEmbedding") or node.domain or len(model.graph.node) != 1:
            continue
        opset = {o.domain: o.version for o in model.opset_import}.get("", 0)
        for inputs, outputs in case.data_sets:
            feed = dict(zip([i.name for i in model.graph.input], [to_python(x) for x in inputs],
                            strict=False))
            arrays = [feed.get(name) if name else None for name in node.input]
            expected = [to_python(x) for x in outputs]
            info = NodeInfo(name=case.name, op_type=node.op_type, domain="", opset=opset,
                            attrs={a.name: helper.get_attribute_value(a) for a in node.attribute},
                            input_dtypes=tuple(None if a is None else a.dtype for a in arrays),
                            output_dtypes=tuple(e.dtype for e in expected),
                            output_used=tuple(bool(o) for o in node.output))
            spec = find_native(info)
            if spec is None:
                assert any(a is not None and a.dtype.name == "bfloat16" for a in arrays), case.name
                continue
            ran += 1
            got = [g for g, o in zip(spec.build(info)(arrays, [None] * len(node.output)), node.output,
                                     strict=True) if o]
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                try:
                    assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
                    np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64),
                                               rtol=case.rtol, atol=case.atol)
                except AssertionError as err:
                    failures.append(f"{case.name} output {i}: {str(err)[:200]}")
    assert ran >= 90
    assert not failures, "\n".join(failures)

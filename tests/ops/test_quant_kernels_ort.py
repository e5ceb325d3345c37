"""The kernels onnxruntime's toolchain writes, against onnxruntime (CPUExecutionProvider).

QuantizeLinear / DequantizeLinear at every opset onnxruntime's CPU provider runs (10, 13,
19, 21, 23, 24, 25: per tensor, per axis, blocked; int8 / uint8, int16 / uint16 and int4 /
uint4 from 21, float8 from 19), DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, and
com.microsoft MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm, QLinearAdd, QLinearMul,
FusedMatMul, BiasGelu, GemmFastGelu, BiasAdd, Gelu on a 0-d value.

The differential rule: every case runs `RUNS` times through `workbench.InferenceSession`
(capture on, so recorded launches replay) with its input arrays allocated once and
refilled with new contents each run, each run compared with onnxruntime on copies.
Integer outputs (and the float outputs of integer products, whose arithmetic is one
float32 multiply and add per element) must be bit-exact; float products agree to float32
summation order.

onnxruntime's Python API cannot hand back int4 / uint4 / float8e5m2 arrays (and returns
float8e4m3fn as its uint8 bits): those cases compare the dequantized round trip only
(and the bits, for e4m3fn).
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import workbench
from workbench import SessionOptions

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RUNS = 8


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _model(nodes, feeds: dict, inits: dict, outputs: list[str], opset: int = 21):
    """A model of `nodes`; `feeds` name -> example array (graph inputs), `inits` name ->
    array or TensorProto (initializers)."""
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                    for n, a in feeds.items()]
    tensors = [v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(v, n) for n, v in inits.items()]
    graph = helper.make_graph(nodes, "toolchain_ops", graph_inputs, [onnx.ValueInfoProto(name=o) for o in outputs],
                              tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def _peer(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's NOT_IMPLEMENTED / INVALID_GRAPH
        pytest.fail(f"onnxruntime refused the model: {e}")


def _reference(model):
    """onnx.reference's evaluator of `model` (the spec's arithmetic)."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model)


def _onnxruntime_saturates_u8s8() -> bool:
    """Whether onnxruntime's uint8 x int8 integer product saturates here: without VNNI,
    MLAS's AVX2 kernel adds each pair of products with vpmaddubsw, into int16, before
    widening (255 * 127 * 2 = 64770 comes out as 32767); the ONNX spec (and
    onnx.reference, and workbench) accumulate exactly in int32."""
    model = _model([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], {"A": np.zeros((1, 2), np.uint8)},
                   {"B": np.full((2, 1), 127, np.int8)}, ["Y"], 13)
    got = _peer(model).run(None, {"A": np.full((1, 2), 255, np.uint8)})[0]
    return int(got.reshape(-1)[0]) != 255 * 127 * 2


def differential(model, fill, *, exact=True, rtol=2e-6, bits=(), skip_outputs=()):
    """Run `model` RUNS times on both runtimes; `fill(rng, run)` -> {name: array} refills the
    same input buffers each run. `bits`: outputs compared as raw bytes (float8 that
    onnxruntime returns as uint8); `skip_outputs`: outputs onnxruntime cannot return."""
    ours = workbench.InferenceSession(model.SerializeToString(),
                                      SessionOptions(capture=True, decode_memo_verify=False))
    fallback = [p.node.op_type for p in ours.plan.nodes if p.spec.kind != "native"]
    assert not fallback, f"not native: {fallback}"
    peer = _peer(model)
    names = [o.name for o in peer.get_outputs() if o.name not in skip_outputs]
    rng = rng_for(model.graph.node[0].op_type, len(model.graph.node), tuple(names))
    first = fill(rng, 0)
    buffers = {k: np.empty_like(v) for k, v in first.items()}
    addresses = {k: v.ctypes.data for k, v in buffers.items()}
    for run in range(RUNS):
        values = first if run == 0 else fill(rng, run)
        for k, v in values.items():
            buffers[k][...] = v
        got = dict(zip([o.name for o in ours.get_outputs()], ours.run(None, buffers)))
        want = dict(zip(names, peer.run(names, {k: v.copy() for k, v in buffers.items()})))
        for name in names:
            g, w = got[name], want[name]
            if name in bits:
                assert g.shape == w.shape, (name, run)
                np.testing.assert_array_equal(g.view(np.uint8), w, err_msg=f"{name} run {run}")
                continue
            assert g.shape == w.shape and g.dtype == w.dtype, (name, run, g.shape, w.shape, g.dtype, w.dtype)
            if exact or g.dtype.kind in "iub":
                np.testing.assert_array_equal(g, w, err_msg=f"{name} run {run}")
            else:
                scale = max(1.0, float(np.abs(w.astype(np.float64)).max(initial=0.0)))
                diff = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max(initial=0.0))
                assert diff <= rtol * scale, f"{name} run {run}: max |diff| {diff:.3g}"
    assert {k: v.ctypes.data for k, v in buffers.items()} == addresses
    return ours


def _quant_input(rng, shape, scale):
    """Floats that exercise rounding ties (exact halves of the scale), saturation at both
    ends, zeros and negative zeros."""
    kind = rng.integers(0, 4)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32([0.5, 4.0, 40.0, 400.0][kind]) * scale
    ties = (rng.integers(-300, 300, shape) + 0.5).astype(np.float32) * scale
    pick = rng.random(shape) < 0.3
    x = np.where(pick, ties, x).astype(np.float32)
    x.reshape(-1)[:2] = (0.0, -0.0)
    return x


# --- QuantizeLinear / DequantizeLinear -------------------------------------------------------

_INT_TYPES = {TP.UINT8: np.uint8, TP.INT8: np.int8, TP.INT16: np.int16, TP.UINT16: np.uint16,
              TP.INT4: ml_dtypes.int4, TP.UINT4: ml_dtypes.uint4}
_FLOAT8 = {TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TP.FLOAT8E5M2: ml_dtypes.float8_e5m2}


def _qdq_cases():
    for opset in (10, 13, 19, 21, 23, 24, 25):
        types = [TP.UINT8, TP.INT8]
        if opset >= 19:
            types += [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2]
        if opset >= 21:
            types += [TP.INT16, TP.UINT16, TP.INT4, TP.UINT4]
        grains = ["tensor"] + (["axis0", "axis1"] if opset >= 13 else []) + (["block"] if opset >= 21 else [])
        for t in types:
            for g in grains:
                if t in _FLOAT8 and g == "block" and opset < 21:
                    continue
                yield pytest.param(opset, t, g, id=f"opset{opset}-{TP.DataType.Name(t).lower()}-{g}")


@pytest.mark.parametrize("opset,qtype,grain", list(_qdq_cases()))
def test_quantize_dequantize_linear(opset, qtype, grain):
    r = rng_for("qdq", opset, qtype, grain)
    shape = (6, 40)
    attrs = {}
    if grain == "tensor":
        sshape = ()
    elif grain.startswith("axis"):
        axis = int(grain[-1])
        attrs["axis"] = axis
        sshape = (shape[axis],)
    else:
        attrs.update(axis=1, block_size=16)
        sshape = (shape[0], 3)  # ceil(40 / 16): a partial last block
    scale = (r.random(sshape) * 0.05 + 0.01).astype(np.float32)
    float8 = qtype in _FLOAT8
    if float8:
        zp = helper.make_tensor("zp", qtype, sshape, [0.0] * int(np.prod(sshape, dtype=int)))
        if qtype == TP.FLOAT8E4M3FN and opset >= 19:
            attrs_q = {**attrs, "saturate": int(r.integers(0, 2))}
        else:
            attrs_q = dict(attrs)
    else:
        lo, hi = ml_dtypes.iinfo(_INT_TYPES[qtype]).min, ml_dtypes.iinfo(_INT_TYPES[qtype]).max
        zvals = r.integers(lo, hi + 1, sshape)
        zp = helper.make_tensor("zp", qtype, sshape, np.asarray(zvals).reshape(-1).tolist())
        attrs_q = dict(attrs)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs_q),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs)]
    base = float(scale.mean())
    model = _model(nodes, {"x": np.zeros(shape, np.float32)}, {"scale": scale, "zp": zp}, ["q", "y"], opset)
    numpy_visible = qtype in (TP.UINT8, TP.INT8, TP.INT16, TP.UINT16)
    differential(model, lambda rng, run: {"x": _quant_input(rng, shape, base)},
                 bits=("q",) if qtype == TP.FLOAT8E4M3FN else (),
                 skip_outputs=() if numpy_visible or qtype == TP.FLOAT8E4M3FN else ("q",))


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
def test_dequantize_linear_runtime_input_without_zero_point(opset, qtype):
    """quantize_dynamic's embedding: a quantized table Gathered at run time, dequantized at
    the model's opset (below 19 onnx.reference has no DequantizeLinear)."""
    r = rng_for("dq_rt", opset, qtype)
    table = r.integers(np.iinfo(qtype).min, np.iinfo(qtype).max + 1, (50, 16)).astype(qtype)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"]),
             helper.make_node("DequantizeLinear", ["g", "scale"], ["y"]),
             helper.make_node("DequantizeLinear", ["g", "scale", "zp"], ["y_zp"])]
    inits = {"table": table, "scale": np.array(0.0123, np.float32), "zp": np.array(3, qtype)}
    model = _model(nodes, {"ids": np.zeros((1, 5), np.int64)}, inits, ["y", "y_zp"], opset)
    differential(model, lambda rng, run: {"ids": rng.integers(0, 50, (1, 5))})


@pytest.mark.parametrize("opset", [19, 21, 23])
def test_quantize_linear_float16_input_and_scale(opset):
    r = rng_for("q16", opset)
    scale = np.array(0.03125, np.float16)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"])]
    model = _model(nodes, {"x": np.zeros((4, 24), np.float16)},
                   {"scale": scale, "zp": np.array(int(r.integers(0, 255)), np.uint8)}, ["q", "y"], opset)
    differential(model, lambda rng, run: {"x": _quant_input(rng, (4, 24), 0.03125).astype(np.float16)})


# --- DynamicQuantizeLinear, MatMulInteger, QLinearMatMul -------------------------------------


def _dynamic_input(rng, shape, run):
    """Mixed signs, all positive, all negative, all zero (an empty range: scale 1), ties."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.choice([0.01, 1.0, 30.0]))
    kind = run % 5
    if kind == 1:
        x = np.abs(x)
    elif kind == 2:
        x = -np.abs(x)
    elif kind == 3:
        x[...] = 0.0
    elif kind == 4:
        x = (rng.integers(-127, 128, shape) + 0.5).astype(np.float32)
    return x


def test_dynamic_quantize_linear():
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])]
    model = _model(nodes, {"x": np.zeros((3, 37), np.float32)}, {}, ["y", "scale", "zp"], 13)
    differential(model, lambda rng, run: {"x": _dynamic_input(rng, (3, 37), run)})


MMI_CASES = [
    pytest.param(a, b, zp, id=f"{np.dtype(a).name}x{np.dtype(b).name}-{zp}")
    for a, b in ((np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8), (np.int8, np.uint8))
    for zp in ("none", "scalar", "per_column")  # onnxruntime refuses a per-row a_zero_point
]


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("a_type,b_type,zp", MMI_CASES)
def test_matmul_integer(a_type, b_type, zp):
    r = rng_for("mmi", a_type, b_type, zp)
    M, K, N = 5, 48, 24
    inits = {"B": _ints(r, b_type, (K, N))}
    names = ["A", "B"]
    if zp == "scalar":
        inits.update(a_zp=_ints(r, a_type, ()), b_zp=_ints(r, b_type, ()))
        names += ["a_zp", "b_zp"]
    elif zp == "per_column":
        inits.update(b_zp=_ints(r, b_type, (N,)))
        names += ["", "b_zp"]
    model = _model([helper.make_node("MatMulInteger", names, ["Y"])], {"A": np.zeros((M, K), a_type)}, inits,
                   ["Y"], 13)
    differential(model, lambda rng, run: {"A": _ints(rng, a_type, (M, K))})


@pytest.mark.parametrize("zp", ["none", "scalar", "per_column"])
def test_uint8_int8_products_saturate_where_onnxruntimes_do(zp):
    """Without VNNI, onnxruntime's uint8 x int8 kernels add each pair of products into
    int16 with saturation (`vpmaddubsw`): workbench takes them so where the plan asks for
    onnxruntime's arithmetic (a quantized model, by default), bit for bit; with
    onnxruntime_rounding="never" it keeps the spec's exact sums, onnx.reference's. Inputs
    at the extremes (255 x 127 pairs saturate), 8 runs refilling A in place."""
    M, K, N = 4, 33, 16  # an odd K: the last product is a pair of its own
    r = rng_for("saturating", zp)
    inits = {"B": np.where(r.random((K, N)) < 0.5, 127, -128).astype(np.int8)}
    names = ["A", "B"]
    if zp == "scalar":
        inits.update(a_zp=np.array(7, np.uint8), b_zp=np.array(-3, np.int8))
        names += ["a_zp", "b_zp"]
    elif zp == "per_column":
        inits.update(b_zp=_ints(r, np.int8, (N,)))
        names += ["", "b_zp"]
    model = _model([helper.make_node("MatMulInteger", names, ["Y"])], {"A": np.zeros((M, K), np.uint8)}, inits,
                   ["Y"], 13)

    def fill(rng, run):
        return {"A": np.where(rng.random((M, K)) < 0.8, 255, rng.integers(0, 256, (M, K))).astype(np.uint8)}

    ours = differential(model, fill)  # onnxruntime's values, saturated or not
    assert ours.executor.plan.nodes[0].info.onnxruntime_rounding
    saturates = _onnxruntime_saturates_u8s8()
    from workbench.ops.quantize import u8s8_pairs_saturate
    assert u8s8_pairs_saturate() == saturates, "the CPU reading disagrees with onnxruntime's behaviour"
    exact = workbench.InferenceSession(model.SerializeToString(), SessionOptions(onnxruntime_rounding="never"))
    a = fill(np.random.default_rng(3), 0)
    spec = _reference(model).run(None, a)[0]
    np.testing.assert_array_equal(exact.run(None, a)[0], spec)
    assert saturates == (not np.array_equal(ours.run(None, a)[0], spec))


def test_matmul_integer_batched_runtime_b():
    model = _model([helper.make_node("MatMulInteger", ["A", "B", "a_zp"], ["Y"])],
                   {"A": np.zeros((2, 3, 64), np.uint8), "B": np.zeros((64, 16), np.int8)},
                   {"a_zp": np.array(128, np.uint8)}, ["Y"], 13)
    differential(model, lambda rng, run: {"A": _ints(rng, np.uint8, (2, 3, 64)), "B": _ints(rng, np.int8, (64, 16))})


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(opset, b_type, per_column):
    r = rng_for("qlmm", opset, b_type, per_column)
    M, K, N = 4, 40, 12
    b_scale = (r.random(N if per_column else ()) * 0.02 + 0.005).astype(np.float32)
    b_zp = np.zeros(N, b_type) if per_column else _ints(r, b_type, ())
    if per_column and b_type == np.uint8:
        b_zp = _ints(r, b_type, (N,))
    inits = {"a_scale": np.array(0.03, np.float32), "a_zp": np.array(120, np.uint8), "B": _ints(r, b_type, (K, N)),
             "b_scale": b_scale, "b_zp": b_zp, "y_scale": np.array(0.4, np.float32), "y_zp": np.array(100, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp", "y_scale", "y_zp"], ["Y"])
    model = _model([node], {"A": np.zeros((M, K), np.uint8)}, inits, ["Y"], opset)
    differential(model, lambda rng, run: {"A": _ints(rng, np.uint8, (M, K))})


# --- com.microsoft quantized products -------------------------------------------------------


@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
@pytest.mark.parametrize("extras", ["none", "zp", "zp_bias", "per_column_bias"])
def test_matmul_integer_to_float(b_type, extras):
    r = rng_for("mitf", b_type, extras)
    M, K, N = 3, 32, 20
    per_column = extras == "per_column_bias"
    b_scale = (r.random(N if per_column else ()) * 0.02 + 0.001).astype(np.float32)
    inits = {"B": _ints(r, b_type, (K, N)), "a_scale": np.array(0.0173, np.float32), "b_scale": b_scale}
    names = ["A", "B", "a_scale", "b_scale"]
    if extras != "none":
        inits.update(a_zp=np.array(131, np.uint8), b_zp=_ints(r, b_type, (N,) if per_column else ()))
        names += ["a_zp", "b_zp"]
    if extras in ("zp_bias", "per_column_bias"):
        inits["bias"] = r.standard_normal(N).astype(np.float32)
        names.append("bias")
    node = helper.make_node("MatMulIntegerToFloat", names, ["Y"], domain=MS)
    model = _model([node], {"A": np.zeros((2, M, K), np.uint8)}, inits, ["Y"], 13)
    differential(model, lambda rng, run: {"A": _ints(rng, np.uint8, (2, M, K))})


@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
@pytest.mark.parametrize("extras", ["none", "zp", "zp_bias"])
def test_dynamic_quantize_matmul(b_type, extras):
    r = rng_for("dqmm", b_type, extras)
    K, N = 32, 16
    inits = {"B": _ints(r, b_type, (K, N)), "b_scale": np.array(0.0071, np.float32)}
    names = ["A", "B", "b_scale"]
    if extras != "none":
        inits["b_zp"] = _ints(r, b_type, ())
        names.append("b_zp")
    if extras == "zp_bias":
        inits["bias"] = r.standard_normal(N).astype(np.float32)
        names.append("bias")
    node = helper.make_node("DynamicQuantizeMatMul", names, ["Y"], domain=MS)
    model = _model([node], {"A": np.zeros((1, 3, K), np.float32)}, inits, ["Y"], 13)
    differential(model, lambda rng, run: {"A": _dynamic_input(rng, (1, 3, K), run)})


@pytest.mark.parametrize("output", ["float", "quantized"])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [False, True])
def test_qgemm(output, trans_b, with_c):
    r = rng_for("qgemm", output, trans_b, with_c)
    M, K, N = 4, 24, 10
    b = _ints(r, np.int8, (N, K) if trans_b else (K, N))
    inits = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(7, np.uint8), "B": b,
             "b_scale": np.array(0.011, np.float32), "b_zp": np.array(0, np.int8)}
    names = ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp"]
    names.append("C" if with_c else "")
    if with_c:
        inits["C"] = r.integers(-5000, 5000, (N,)).astype(np.int32)
    if output == "quantized":
        inits.update(y_scale=np.array(0.25, np.float32), y_zp=np.array(90, np.uint8))
        names += ["y_scale", "y_zp"]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("QGemm", names, ["Y"], domain=MS, transB=trans_b, alpha=1.5)
    model = _model([node], {"A": np.zeros((M, K), np.uint8)}, inits, ["Y"], 13)
    differential(model, lambda rng, run: {"A": _ints(rng, np.uint8, (M, K))})


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape", [(3, 37), (37,), (1,)])
def test_qlinear_binary(op, dtype, b_shape):
    r = rng_for("qlbin", op, dtype, b_shape)
    zps = [np.array(int(z), dtype) for z in r.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, 3)]
    inits = {"sa": np.array(0.05, np.float32), "za": zps[0], "sb": np.array(0.031, np.float32), "zb": zps[1],
             "sc": np.array(0.07 if op == "QLinearAdd" else 0.9, np.float32), "zc": zps[2]}
    node = helper.make_node(op, ["A", "sa", "za", "B", "sb", "zb", "sc", "zc"], ["C"], domain=MS)
    model = _model([node], {"A": np.zeros((3, 37), dtype), "B": np.zeros(b_shape, dtype)}, inits, ["C"], 13)
    differential(model, lambda rng, run: {"A": _ints(rng, dtype, (3, 37)), "B": _ints(rng, dtype, b_shape)})


# --- com.microsoft fused float ops ------------------------------------------------------------

FUSED_MATMUL_CASES = [
    ((4, 8), (8, 5), {}),
    ((2, 4, 8), (8, 5), {"alpha": 0.125}),
    ((2, 8, 4), (2, 5, 8), {"transA": 1, "transB": 1, "alpha": 0.5}),
    ((2, 3, 4, 8), (2, 3, 5, 8), {"transB": 1, "alpha": 0.35355339}),
    ((4, 2, 8), (2, 8, 5), {"transBatchA": 1}),
    ((2, 4, 8), (5, 2, 8), {"transBatchB": 1, "transB": 1}),
    ((4, 2, 3, 8), (2, 3, 8, 5), {"transBatchA": 1}),
    ((8, 2, 4), (2, 8, 5), {"transBatchA": 1, "transA": 1, "alpha": 2.0}),
]


@pytest.mark.parametrize("a_shape,b_shape,attrs", FUSED_MATMUL_CASES,
                         ids=[f"case{i}" for i in range(len(FUSED_MATMUL_CASES))])
def test_fused_matmul(a_shape, b_shape, attrs):
    node = helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain=MS, **attrs)
    model = _model([node], {"A": np.zeros(a_shape, np.float32), "B": np.zeros(b_shape, np.float32)}, {}, ["Y"], 13)
    differential(model, lambda rng, run: {"A": rng.standard_normal(a_shape).astype(np.float32),
                                          "B": rng.standard_normal(b_shape).astype(np.float32)}, exact=False)


def test_bias_gelu():
    nodes = [helper.make_node("BiasGelu", ["x", "bias"], ["g"], domain=MS)]
    r = rng_for("bias_gelu")
    model = _model(nodes, {"x": np.zeros((2, 3, 16), np.float32)},
                   {"bias": r.standard_normal(16).astype(np.float32)}, ["g"], 13)
    differential(model, lambda rng, run: {"x": rng.standard_normal((2, 3, 16)).astype(np.float32) * 2},
                 exact=False, rtol=5e-6)


def _against_parts(fused, parts, shapes, rtol=1e-5):
    """onnxruntime's CPU provider lacks some fusions' ops (its CUDA / ROCm fusions write
    them): the kernel against onnxruntime running the ops they replace, on one buffer."""
    ours = workbench.InferenceSession(fused.SerializeToString())
    peer = _peer(parts)
    r = rng_for("parts", fused.graph.node[0].op_type)
    feeds = {k: np.empty(v, np.float32) for k, v in shapes.items()}
    for _ in range(RUNS):
        for v in feeds.values():
            v[...] = r.standard_normal(v.shape) * 2
        (got,) = ours.run(None, feeds)
        (want,) = peer.run(None, {k: v.copy() for k, v in feeds.items()})
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def test_bias_add_against_its_parts():
    bias = rng_for("bias_add").standard_normal(16).astype(np.float32)
    shapes = {"x": (2, 3, 16), "skip": (2, 3, 16)}
    feeds = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    fused = _model([helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)], feeds, {"bias": bias},
                   ["y"], 13)
    parts = _model([helper.make_node("Add", ["x", "bias"], ["t"]), helper.make_node("Add", ["t", "skip"], ["y"])],
                   feeds, {"bias": bias}, ["y"], 13)
    _against_parts(fused, parts, shapes, rtol=1e-6)


@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_top_binade_and_subnormals(saturate):
    """onnxruntime's float8 conversion around the largest value ([448, 512) for e4m3fn,
    where it truncates before it rounds) and through the subnormals, bit for bit."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], saturate=saturate, axis=1),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], axis=1),
             helper.make_node("QuantizeLinear", ["x", "scale", "zp5"], ["q5"], saturate=saturate, axis=1),
             helper.make_node("DequantizeLinear", ["q5", "scale", "zp5"], ["y5"], axis=1)]
    scale = np.array([1.0, 0.0173, 128.0, 3e-3], np.float32)
    inits = {"scale": scale, "zp": helper.make_tensor("zp", TP.FLOAT8E4M3FN, [4], [0.0] * 4),
             "zp5": helper.make_tensor("zp5", TP.FLOAT8E5M2, [4], [0.0] * 4)}
    model = _model(nodes, {"x": np.zeros((256, 4), np.float32)}, inits, ["q", "y", "y5"], 21)

    def fill(rng, run):
        mags = [rng.uniform(440, 520, (256, 1)), rng.uniform(0, 2 ** -6, (256, 1)),
                rng.uniform(50000, 66000, (256, 1)) / 128, 10.0 ** rng.uniform(-12, 6, (256, 1))][run % 4]
        sign = rng.choice([-1.0, 1.0], (256, 4))
        return {"x": (mags * sign * scale).astype(np.float32)}

    differential(model, fill, bits=("q",), skip_outputs=("q5",))


def test_gemm_fast_gelu_against_its_parts():
    r = rng_for("gemm_fast_gelu")
    inits = {"w": r.standard_normal((16, 8)).astype(np.float32), "bias": r.standard_normal(8).astype(np.float32)}
    feeds = {"x": np.zeros((2, 3, 16), np.float32)}
    fused = _model([helper.make_node("GemmFastGelu", ["x", "w", "bias"], ["y"], domain=MS)], feeds, inits, ["y"], 13)
    parts = _model([helper.make_node("MatMul", ["x", "w"], ["p"]),
                    helper.make_node("FastGelu", ["p", "bias"], ["y"], domain=MS)], feeds, inits, ["y"], 13)
    _against_parts(fused, parts, {"x": (2, 3, 16)})


def test_gelu_on_a_0d_value():
    """The fuzz finding: com.microsoft Gelu (what the GELU fusion makes) on a 0-d value."""
    nodes = [helper.make_node("Gelu", ["x"], ["y"], domain=MS)]
    model = _model(nodes, {"x": np.zeros((), np.float32)}, {}, ["y"], 13)
    differential(model, lambda rng, run: {"x": np.array(rng.standard_normal() * 3, np.float32)},
                 exact=False, rtol=1e-6)


# --- errors ---------------------------------------------------------------------------------


def test_mismatched_scale_names_the_node():
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"], name="dq_bad", axis=1)]
    model = _model(nodes, {"q": np.zeros((2, 6), np.int8)}, {"scale": np.ones(5, np.float32)}, ["y"], 13)
    session = workbench.InferenceSession(model.SerializeToString())
    with pytest.raises(workbench.WorkbenchError, match="dq_bad"):
        session.run(None, {"q": np.zeros((2, 6), np.int8)})

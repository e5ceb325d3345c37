"""The kernels feeding MatMulNBits' int8 requantization round as onnxruntime's CPU
kernels do (`ops.ort_float32`): SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization / RMSNormalization, Sigmoid and QuickGelu (the load-time
SiLU fusion's kernel), float32.

Each test builds a one-node model, runs it six or more times in workbench and in
onnxruntime with the input arrays refilled in place (one address, new contents), at
SmolLM2-135M's shapes (hidden 576, MLP 1536; a decode row and a 16-token prefill) and
at others (rows shorter than 16, lengths not a multiple of 8 or 4, several axes).
Where onnxruntime takes the kernels these were read from (x86-64 with AVX2 and FMA;
MLAS's AVX512 SiLU kernel for QuickGelu with alpha 1) the results are bit for bit
onnxruntime's (0 ulps, signed zeros included); elsewhere within the tolerance the
previous formulas were held to. float16 inputs stay within their previous tolerance.

Sessions here ask for onnxruntime's rounding ("always"); by default ("auto") a session
takes it only where its model quantizes activations at run time (the end of this file).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench.ops import ort_float32

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
#: a one-node model requantizes nothing, so "auto" would not round as onnxruntime does
ROUNDED = workbench.SessionOptions(onnxruntime_rounding="always")


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return set()


FLAGS = _cpu_flags()
#: onnxruntime's norms and MLAS's logistic take their AVX2 / FMA3 code
EXACT = {"avx2", "fma"} <= FLAGS
#: MLAS's SiLU kernel (QuickGelu alpha 1) is its AVX512F one
EXACT_SILU = EXACT and "avx512f" in FLAGS


def _bits_differ(got: np.ndarray, want: np.ndarray) -> int:
    """How many elements differ in their bits (so -0 and +0 differ; NaN equals NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    g, w = got.view(view), want.view(view)
    return int(np.count_nonzero((g != w) & ~(np.isnan(got) & np.isnan(want))))


def _model(op, domain, inputs, outputs, attrs, inits=(), opset=17):
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
            np.dtype(np.float64): TensorProto.DOUBLE}
    node = helper.make_node(op, [n for n, _ in inputs] + [n for n, _ in inits], outputs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, elem[a.dtype], list(a.shape)) for n, a in inputs],
        [helper.make_tensor_value_info(o, elem[inputs[0][1].dtype], None) for o in outputs if o],
        [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


def _pair(model, options=ROUNDED):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return workbench.InferenceSession(model, options=options), peer


def _compare(ours, peer, feeds, exact, rtol, atol, what):
    want = peer.run(None, {k: v.copy() for k, v in feeds.items()})
    got = ours.run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        if exact:
            assert _bits_differ(g, w) == 0, (what, i, _bits_differ(g, w), float(np.abs(g - w).max()))
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} output {i}")


# --- SkipSimplifiedLayerNormalization -------------------------------------------------

SKIP_SHAPES = [(1, 1, 576), (1, 16, 576), (1, 1, 1536), (2, 3, 5), (1, 4, 15), (3, 2, 16), (1, 3, 33), (2, 2, 100)]


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("shape", SKIP_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm_is_onnxruntimes_result(shape, with_bias, compiled, monkeypatch):
    """The squares summed left to right in float32 (no fma), sqrt(sum / n + eps), then
    sum / that * gamma: y and the sum output bit for bit over eight runs (the decode's
    one-row form keeps its plan for the same arrays: runs 2.. take it), that row
    compiled (`mlas_jit.skip_rms_row`) and in numpy."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    r = np.random.default_rng([7, *shape, with_bias])
    hidden = shape[-1]
    x, skip = np.empty(shape, np.float32), np.empty(shape, np.float32)
    inits = [("gamma", (r.standard_normal(hidden) * 0.3 + 1).astype(np.float32))]
    if with_bias:
        inits.append(("bias", r.standard_normal(hidden).astype(np.float32)))
    model = _model("SkipSimplifiedLayerNormalization", MS, [("x", x), ("skip", skip)], ["y", "", "", "sum"],
                   {"epsilon": 1e-5}, inits)
    ours, peer = _pair(model)
    for run in range(8):
        x[...] = r.standard_normal(shape) * (10.0 ** (run % 3 - 1))
        skip[...] = r.standard_normal(shape) * 3
        _compare(ours, peer, {"x": x, "skip": skip}, EXACT, 1e-5, 2e-5, f"run {run}")


def test_skip_simplified_layer_norm_fp16_stays_within_tolerance():
    r = np.random.default_rng(16)
    x, skip = np.empty((1, 4, 576), np.float16), np.empty((1, 4, 576), np.float16)
    model = _model("SkipSimplifiedLayerNormalization", MS, [("x", x), ("skip", skip)], ["y", "", "", "sum"],
                   {"epsilon": 1e-5}, [("gamma", r.standard_normal(576).astype(np.float16))])
    ours, peer = _pair(model)
    for run in range(6):
        x[...], skip[...] = r.standard_normal((2, 1, 4, 576))
        _compare(ours, peer, {"x": x, "skip": skip}, False, 2e-3, 2e-3, f"run {run}")


# --- SimplifiedLayerNormalization and RMSNormalization ----------------------------------

RMS_CASES = [((1, 1, 576), -1), ((1, 16, 576), -1), ((4, 1536), -1), ((3, 7), -1), ((5, 15), -1), ((2, 16), -1),
             ((6, 19), -1), ((2, 20), -1), ((3, 22), -1), ((2, 3, 103), -1), ((3, 4, 50), 1), ((2, 1030), -1)]


@pytest.mark.parametrize("rounding", ["always", "auto"])
@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize(("shape", "axis"), RMS_CASES)
@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "RMSNormalization"])
def test_rms_norms_are_onnxruntimes_result(op, shape, axis, compiled, rounding, monkeypatch):
    """Rows of 16 or more: the squares in 8 fma lanes, folded 8 -> 4 -> 2 -> 1, the next
    4 left over added as rounded squares, the rest by fma; y = (x * (1 / sqrt(sum / n +
    eps))) * scale. Shorter rows: left to right without fma, and a division. y and
    inv_std_var bit for bit over six runs, compiled (`mlas_jit.rms_rows`) and emulated.
    By default ("auto", a float model) the compiled form is taken too, where numba is;
    numpy's arithmetic otherwise, within tolerance."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    opset = 23 if op == "RMSNormalization" else 17
    r = np.random.default_rng([23, *shape, axis % len(shape), opset])
    x = np.empty(shape, np.float32)
    scale = (r.standard_normal(shape[axis % len(shape):]) * 0.3 + 1).astype(np.float32)
    outputs = ["y"] if op == "RMSNormalization" else ["y", "inv"]
    model = _model(op, "", [("x", x)], outputs, {"epsilon": 1e-5, "axis": axis}, [("scale", scale)], opset=opset)
    ours, peer = _pair(model, workbench.SessionOptions(onnxruntime_rounding=rounding))
    exact = EXACT and (rounding == "always" or compiled)
    for run in range(6):
        x[...] = r.standard_normal(shape) * (10.0 ** (run % 3 - 1))
        _compare(ours, peer, {"x": x}, exact, 1e-5, 2e-5, f"run {run}")


def test_simplified_layer_norm_float64_is_onnxruntimes_result():
    """float64: left to right, a division (onnxruntime's double loop), at any length."""
    r = np.random.default_rng(64)
    for shape in [(2, 7), (3, 576)]:
        x = np.empty(shape, np.float64)
        model = _model("SimplifiedLayerNormalization", "", [("x", x)], ["y"], {"epsilon": 1e-5, "axis": -1},
                       [("scale", r.standard_normal(shape[-1]))])
        ours, peer = _pair(model)
        for run in range(6):
            x[...] = r.standard_normal(shape) * 3
            _compare(ours, peer, {"x": x}, True, 0, 0, f"{shape} run {run}")


def test_simplified_layer_norm_fp16_stays_within_tolerance():
    r = np.random.default_rng(17)
    x = np.empty((3, 576), np.float16)
    model = _model("SimplifiedLayerNormalization", "", [("x", x)], ["y"], {"epsilon": 1e-5, "axis": -1},
                   [("scale", r.standard_normal(576).astype(np.float16))])
    ours, peer = _pair(model)
    for run in range(6):
        x[...] = r.standard_normal((3, 576))
        _compare(ours, peer, {"x": x}, False, 2e-3, 2e-3, f"run {run}")


def test_fma_double_rounding_is_caught_and_rounded_exactly():
    """The float64 route to a float32 fma can round twice: (1 + 2^-20)(1 - 2^-20) +
    (2^24 + 2) = 2^24 + 3 - 2^-40 rounds in float64 onto the float32 halfway point
    2^24 + 3, then to even (2^24 + 4); the fma rounds once, down to 2^24 + 2. The guard
    sees the halfway float64 sum and the exact path rounds it right."""
    a, b, c = np.float32(1 + 2.0 ** -20), np.float32(1 - 2.0 ** -20), np.float32(2.0 ** 24 + 2)
    route64 = np.float64(a) * np.float64(b) + np.float64(c)
    assert np.float32(route64) == np.float32(2.0 ** 24 + 4)
    assert bool(ort_float32._any_halfway(np.array([route64]))[0])
    assert ort_float32.fma32(np.array([a]), np.array([b]), np.array([c]))[0] == np.float32(2.0 ** 24 + 2)
    assert ort_float32.fma32(a, b, np.float32(2.0 ** 24 + 4)) == np.float32(2.0 ** 24 + 4)  # not halfway
    assert not bool(ort_float32._any_halfway(np.array([np.float64(2.0 ** 24 + 4)]))[0])


def test_exact_rare_path_gives_the_same_results(monkeypatch):
    """With every float64 sum taken for halfway, the exact path (`fma32`) runs for
    every element and row: it computes the same bits as onnxruntime."""
    r = np.random.default_rng(5)
    monkeypatch.setattr(ort_float32, "_any_halfway", lambda sums: np.ones(sums.shape, bool))
    rows = (r.standard_normal((2, 27)) * 3).astype(np.float32)  # 3 fma steps, 3 left: 0..2 fma tail
    x = (r.standard_normal(40) * 4).astype(np.float32)
    model = _model("SimplifiedLayerNormalization", "", [("x", rows)], ["y", "inv"], {"epsilon": 1e-5, "axis": -1},
                   [("scale", np.ones(27, np.float32))])
    _, peer = _pair(model)
    inv = peer.run(None, {"x": rows})[1]
    ss = ort_float32.sum_of_squares_emulated(rows)
    assert _bits_differ(np.float32(1) / np.sqrt(ss / np.float32(27) + np.float32(1e-5)), inv) == 0 or not EXACT
    _, peer = _pair(_model("Sigmoid", "", [("x", x)], ["y"], {}))
    assert _bits_differ(ort_float32.logistic_emulated(x), peer.run(None, {"x": x})[0]) == 0 or not EXACT


# --- Sigmoid and QuickGelu --------------------------------------------------------------


def _activations(r, shape, run):
    """SiLU inputs as a decode sees them, plus the edges: the clamps at +-18, the
    20 inputs near 18 where the logistic kernel exceeds 1, signed zeros, inf, NaN."""
    v = (r.standard_normal(shape) * (10.0 ** (run % 3 - 1))).astype(np.float32)
    flat = v.reshape(-1)
    edges = np.array([17.482065, 17.993553, 18.0, 18.5, -18.0, -18.5, 0.0, -0.0, 1e-30, -1e-30,
                      np.inf, -np.inf, np.nan, 40.0, -40.0], np.float32)
    k = min(len(edges), flat.size)
    flat[:k] = edges[:k]
    return v


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("shape", [(1, 1, 1536), (1, 16, 1536), (1, 1, 576), (3, 7), (1, 13)])
def test_sigmoid_is_mlas_logistic(shape, compiled, monkeypatch):
    """MLAS's logistic (clamp to [-18, 18], two fma chains, p / q + 0.5, clamped below
    at 0): bit for bit over six runs, compiled (`mlas_jit`) and emulated."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    r = np.random.default_rng([6, *shape])
    x = np.empty(shape, np.float32)
    ours, peer = _pair(_model("Sigmoid", "", [("x", x)], ["y"], {}))
    for run in range(6):
        x[...] = _activations(r, shape, run)
        _compare(ours, peer, {"x": x}, EXACT, 1e-6, 1e-7, f"run {run}")


def test_sigmoid_fp16_stays_within_tolerance():
    r = np.random.default_rng(18)
    x = np.empty((4, 300), np.float16)
    ours = workbench.InferenceSession(_model("Sigmoid", "", [("x", x)], ["y"], {}))
    for _ in range(6):
        x[...] = r.standard_normal((4, 300)) * 4
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
        np.testing.assert_allclose(ours.run(None, {"x": x})[0].astype(np.float64), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("shape", [(1, 1, 1536), (1, 16, 1536), (2, 45)])
def test_quick_gelu_is_onnxruntimes_result(alpha, shape, compiled, monkeypatch):
    """x * logistic(alpha x): alpha x in float32 (none where alpha is 1), MLAS's
    logistic (clamped to [0, 1] where alpha is 1: its SiLU kernel), times x; bit for bit
    over six runs, compiled (`mlas_jit`) and emulated."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    r = np.random.default_rng([12, *shape, int(alpha * 1000)])
    x = np.empty(shape, np.float32)
    ours, peer = _pair(_model("QuickGelu", MS, [("x", x)], ["y"], {"alpha": alpha}))
    exact = EXACT_SILU if alpha == 1.0 else EXACT
    for run in range(6):
        x[...] = _activations(r, shape, run)
        _compare(ours, peer, {"x": x}, exact, 1e-6, 1e-6, f"run {run}")


def test_silu_fusion_computes_onnxruntimes_fused_value():
    """x * Sigmoid(x), fused at load into QuickGelu(alpha=1) by workbench and by
    onnxruntime alike: the decode's SiLU, bit for bit over six runs at (1, 16, 1536)."""
    r = np.random.default_rng(99)
    x = np.empty((1, 16, 1536), np.float32)
    node_s = helper.make_node("Sigmoid", ["x"], ["s"])
    node_m = helper.make_node("Mul", ["x", "s"], ["y"])
    graph = helper.make_graph([node_s, node_m], "silu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    ours, peer = _pair(model)
    for run in range(6):
        x[...] = _activations(r, x.shape, run)
        _compare(ours, peer, {"x": x}, EXACT_SILU, 1e-6, 1e-6, f"run {run}")


def _silu_then(quantizer: str) -> onnx.ModelProto:
    """x -> SiLU (fused into QuickGelu at load) -> `quantizer`: a MatMulNBits at
    accuracy_level 4 (int8 products: activations requantized per block), at level 0
    (float32 products), or a plain MatMul."""
    rng = np.random.default_rng(31)
    k, n, block = 64, 16, 32
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["h"])]
    inits = []
    if quantizer == "MatMul":
        nodes.append(helper.make_node("MatMul", ["h", "w"], ["y"]))
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"))
    else:
        level = 4 if quantizer == "int8" else 0
        nodes.append(helper.make_node("MatMulNBits", ["h", "qw", "scales"], ["y"], domain=MS, K=k, N=n, bits=4,
                                      block_size=block, accuracy_level=level))
        inits += [numpy_helper.from_array(rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8), "qw"),
                  numpy_helper.from_array((rng.random(n * k // block) * 0.1 + 0.01).astype(np.float32), "scales")]
    graph = helper.make_graph(nodes, "silu_then", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("quantizer", ["int8", "float", "MatMul"])
def test_onnxruntime_rounding_is_taken_where_activations_are_requantized(quantizer):
    """By default ("auto") the costlier emulation of onnxruntime's rounding is taken
    only where the model quantizes activations at run time (here MatMulNBits at
    accuracy_level 4, whose int8 A a one-ulp difference upstream changes); elsewhere
    numpy's arithmetic, within a few ulps. Either way every output over six runs
    refilling x in place is onnxruntime's: bit for bit where requantized (on AVX-512,
    where MLAS's int8 kernel and SiLU are the emulated ones), within 1e-5 elsewhere."""
    model = _silu_then(quantizer)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ours = workbench.InferenceSession(model)
    rounded = quantizer == "int8"
    assert ours.executor.onnxruntime_rounding is rounded
    kernels = {p.node.op_type: p.info.onnxruntime_rounding for p in ours.executor.plan.nodes}
    assert kernels["QuickGelu"] is rounded, kernels
    r = np.random.default_rng(32)
    x = np.empty((1, 64), np.float32)
    for run in range(6):
        x[...] = r.standard_normal(x.shape) * 3
        want = peer.run(None, {"x": x.copy()})[0]
        got = ours.run(None, {"x": x})[0]
        if rounded and EXACT_SILU and {"avx512bw", "avx512dq", "avx512vl"} <= FLAGS:
            assert _bits_differ(got, want) == 0, f"run {run}"
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}")


def test_onnxruntime_rounding_can_be_forced_either_way():
    model = _silu_then("MatMul")
    assert workbench.InferenceSession(model, options=ROUNDED).executor.onnxruntime_rounding is True
    never = workbench.InferenceSession(_silu_then("int8"),
                                       options=workbench.SessionOptions(onnxruntime_rounding="never"))
    assert never.executor.onnxruntime_rounding is False
    with pytest.raises(ValueError, match="onnxruntime_rounding"):
        workbench.SessionOptions(onnxruntime_rounding="sometimes")

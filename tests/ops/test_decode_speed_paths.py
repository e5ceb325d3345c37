"""Differential tests for the speed paths of one-token decode.

Each fast path changes how the work is done (a host-read position and a sliced
attention window on the numpy backend, fused sibling MatMuls, fused norms), never a
value: every test runs its graph at least six times with inputs at stable addresses
and new contents, under the default mechanisms (memo, capture, views), and checks
each run against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort
from oracles import runs_on_one_buffer
from oracles import tensor as _tensor

import workbench
import workbench.ops.gqa_decode as gqa_decode
import workbench.ops.gqa_host_decode as gqa_host_decode
import workbench.ops.group_query_attention as gqa
import workbench.ops.rotary_matrix as rotary_matrix
from workbench import SessionOptions

RUNS = 8
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _close(got, want, run, what):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}: {what}")


def _gqa_decode_model(*, heads=6, kv_heads=2, head=16, hidden=32, capacity=24, max_pos=64, window=-1,
                      qkv="packed", rotary=True):
    """x -> MatMul -> GroupQueryAttention (one token) with a fixed-capacity cache. Q/K/V
    come packed in one input (`qkv="packed"`), as the three views a Split of the fused
    projection gives ("split"), or from MatMuls of their own ("separate"), K's apart
    from Q's."""
    rng = np.random.default_rng(11)
    width = (heads + 2 * kv_heads) * head
    w = (rng.standard_normal((hidden, width)) * 0.3).astype(np.float32)
    angles = np.arange(max_pos)[:, None] * (1.0 / 10000 ** (np.arange(head // 2) / (head // 2)))[None]
    initializers = []
    if rotary:
        initializers += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
                         numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    widths = [heads * head, kv_heads * head, kv_heads * head]
    if qkv == "packed":
        nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"])]
        initializers.append(numpy_helper.from_array(w, "w_qkv"))
        qkv_inputs = ["qkv", "", ""]
    elif qkv == "split":
        nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),
                 helper.make_node("Split", ["qkv", "widths"], ["q", "k", "v"], axis=-1)]
        initializers += [numpy_helper.from_array(w, "w_qkv"),
                         numpy_helper.from_array(np.array(widths, np.int64), "widths")]
        qkv_inputs = ["q", "k", "v"]
    else:
        edges = np.cumsum([0] + widths)
        # k from -x: no sibling of q's MatMul, so not fused into a buffer beside it
        nodes = [helper.make_node("Neg", ["x"], ["minus_x"])]
        nodes += [helper.make_node("MatMul", ["minus_x" if n == "k" else "x", f"w_{n}"], [n]) for n in "qkv"]
        initializers += [numpy_helper.from_array(np.ascontiguousarray(w[:, a:b]), f"w_{n}")
                         for n, a, b in zip("qkv", edges[:-1], edges[1:])]
        qkv_inputs = ["q", "k", "v"]
    kv_shape = [1, kv_heads, capacity, head]
    nodes.append(helper.make_node(
        "GroupQueryAttention",
        qkv_inputs + ["past_key", "past_value", "seqlens_k", "total_sequence_length"]
        + (["cos", "sin"] if rotary else []),
        ["attn", "present_key", "present_value"], domain="com.microsoft",
        num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary), local_window_size=window))
    graph = helper.make_graph(
        nodes, "gqa_decode",
        [_tensor("x", [1, 1, hidden]), _tensor("past_key", kv_shape), _tensor("past_value", kv_shape),
         _tensor("seqlens_k", [1], TensorProto.INT32), _tensor("total_sequence_length", [], TensorProto.INT32)],
        [_tensor("attn", [1, 1, heads * head]), _tensor("present_key", kv_shape),
         _tensor("present_value", kv_shape)],
        initializers)
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8), kv_shape, hidden


class _CountHostPositions:
    """Counts the one-token path's host reads of the position (both of its forms)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = gqa.numpy_first_int

        def counting(array):
            self.calls += 1
            return real(array)
        for module in (gqa, gqa_decode, gqa_host_decode):
            monkeypatch.setattr(module, "numpy_first_int", counting)


class _CountPreparedCalls:
    """Counts the calls `HostDecode` (views prepared once per set of arrays) served."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = gqa_host_decode.HostDecode.run

        def counting(plan, *args):
            result = real(plan, *args)
            self.calls += result is not None
            return result
        monkeypatch.setattr(gqa_host_decode.HostDecode, "run", counting)


@pytest.mark.parametrize(("window", "qkv", "rotary"), [
    (-1, "packed", True), (5, "packed", True), (-1, "split", True), (5, "separate", True),
    (-1, "split", False)])
def test_gqa_host_position_path_on_a_shared_fixed_cache_vs_onnxruntime(monkeypatch, window, qkv, rotary):
    """The shared KV buffer bound in place (the fixed-KV decode loop): attention reads
    rows 0..pos of a 24-row cache, pos read on the host at every call — including the
    captured replays, which re-run the kernel with the new position. Q/K/V packed, as
    adjacent Split views (rotated through one view of both) or in buffers of their own
    (put side by side each call)."""
    counter = _CountHostPositions(monkeypatch)
    prepared = _CountPreparedCalls(monkeypatch)
    model, kv_shape, hidden = _gqa_decode_model(window=window, qkv=qkv, rotary=rotary)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(5)
    x = np.empty((1, 1, hidden), np.float32)
    key = np.zeros(kv_shape, np.float32)
    value = np.zeros(kv_shape, np.float32)
    seqlens = np.empty((1,), np.int32)
    total = np.empty((), np.int32)
    attn = np.empty((1, 1, 96), np.float32)
    ref_key, ref_value = key.copy(), value.copy()
    binding = session.io_binding()
    for name, arr in (("x", x), ("past_key", key), ("past_value", value), ("seqlens_k", seqlens),
                      ("total_sequence_length", total)):
        binding.bind_input(name, arr)
    for name, arr in (("attn", attn), ("present_key", key), ("present_value", value)):
        binding.bind_output(name, arr)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        seqlens[...] = 3 + 2 * run  # not contiguous steps: the position must be read every time
        total[...] = seqlens[0] + 1
        want = oracle.run(None, {"x": x.copy(), "past_key": ref_key, "past_value": ref_value,
                                 "seqlens_k": seqlens.copy(), "total_sequence_length": total.copy()})
        session.run_with_iobinding(binding)
        _close(attn, want[0], run, "attention output")
        _close(key, want[1], run, "present_key")
        _close(value, want[2], run, "present_value")
        ref_key, ref_value = want[1], want[2]
    # every run reads its position on the host, once (the rotary row and the cache row share it)
    assert counter.calls == RUNS
    assert prepared.calls == RUNS, "every run must take the prepared call for this to bite"
    assert (session.recording.capture_events().event == "replay").any(), "the replays must run for this to bite"


def _growing_gqa_session(heads=6, kv_heads=2, head=16, hidden=32, qkv="packed"):
    model, _, _ = _gqa_decode_model(heads=heads, kv_heads=kv_heads, head=head, hidden=hidden, qkv=qkv)
    for vi in list(model.graph.input)[1:3] + list(model.graph.output)[1:]:
        vi.type.tensor_type.shape.dim[2].dim_param = "past" if vi.name.startswith("past") else "total"
    return model, workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))


def test_gqa_keeps_no_spent_growing_cache_alive():
    """With a growing cache every call brings new past and present arrays: the kernel
    keeps nothing of them for the next call (each layer holding its spent past would add
    one generation of the whole KV cache to the peak)."""
    import gc
    import weakref

    _, session = _growing_gqa_session()
    node = next(p for p in session.executor.plan.nodes if p.node.op_type == "GroupQueryAttention")
    kernel, seen = node.fn, {}

    def spy(ins, outs):
        seen["call"] = (list(ins), list(outs))
        return kernel(ins, outs)
    object.__setattr__(node, "fn", spy)
    rng = np.random.default_rng(3)
    past = rng.standard_normal((1, 2, 4, 16)).astype(np.float32)
    feeds = {"x": rng.standard_normal((1, 1, 32)).astype(np.float32), "past_key": past, "past_value": past.copy(),
             "seqlens_k": np.array([4], np.int32), "total_sequence_length": np.array(5, np.int32)}
    for _ in range(3):  # steady: the kernel's kept setups are in place
        session.run(None, feeds)
    ins, outs = seen.pop("call")
    for length in (9, 10, 11):  # straight calls with caches of their own, as growing decode steps
        ins[3], ins[4] = (rng.standard_normal((1, 2, length, 16)).astype(np.float32) for _ in range(2))
        outs[1], outs[2] = (np.empty((1, 2, length + 1, 16), np.float32) for _ in range(2))
        ins[5], ins[6] = np.array([length], np.int32), np.array(length + 1, np.int32)
        caches = [weakref.ref(a) for a in (ins[3], ins[4], outs[1], outs[2])]
        results = kernel(ins, outs)
        np.testing.assert_array_equal(results[1][:, :, :length], ins[3])
        del results
        ins[3] = ins[4] = outs[1] = outs[2] = None
        gc.collect()
        assert all(ref() is None for ref in caches), "a spent cache is still held"


@pytest.mark.parametrize("qkv", ["packed", "split"])
def test_gqa_host_position_path_on_a_growing_cache_vs_onnxruntime(monkeypatch, qkv):
    """Growing KV (a new, one-row-longer present each step): past rows copied, the new
    row appended, attention over all of them; only the caches' checks are redone."""
    counter = _CountHostPositions(monkeypatch)
    prepared = _CountPreparedCalls(monkeypatch)
    heads, kv_heads, head, hidden = 6, 2, 16, 32
    model, session = _growing_gqa_session(heads, kv_heads, head, hidden, qkv)
    oracle = _ort(model)
    rng = np.random.default_rng(6)
    x = np.empty((1, 1, hidden), np.float32)
    past_key = rng.standard_normal((1, kv_heads, 4, head)).astype(np.float32)
    past_value = rng.standard_normal((1, kv_heads, 4, head)).astype(np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        length = past_key.shape[2]
        feeds = {"x": x, "past_key": past_key, "past_value": past_value,
                 "seqlens_k": np.array([length], np.int32), "total_sequence_length": np.array(length + 1, np.int32)}
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        got = session.run(None, feeds)
        for i, what in enumerate(("attention output", "present_key", "present_value")):
            _close(got[i], want[i], run, what)
        past_key, past_value = want[1], want[2]
    assert counter.calls == RUNS
    assert prepared.calls == RUNS


@pytest.mark.parametrize("caches", ["handed back", "views", "strided"])
def test_gqa_growing_cache_fed_back_as_a_decode_loop_does_vs_onnxruntime(monkeypatch, caches):
    """A growing decode loop feeds each step's presents back as the next past: arrays of
    their own, one row longer every step, which the kernel recognises without its full
    cache checks; so it does pasts that are views of wider buffers (a fixed cache's rows,
    as `Generator(kv="fixed")` feeds them), whose base names the array owning their
    memory. Views whose base is not such an array (`as_strided`'s) take the full checks.
    Either way every run agrees with onnxruntime, given copies."""
    served = []
    real = gqa_host_decode.HostDecode.run

    def spy(plan, inputs, outs, present_shape, shared, window, bias=None):
        served.append(shared is gqa_decode.NOT_SHARED)
        return real(plan, inputs, outs, present_shape, shared, window, bias)
    monkeypatch.setattr(gqa_host_decode.HostDecode, "run", spy)
    model, _ = _growing_gqa_session(6, 2, 16, 32, "split")
    # an input of the present's length (as a decode model's attention mask) names it, so
    # the executor allocates the presents before the call, as in a real model
    model.graph.input.append(_tensor("attention_mask", [1, "total"], TensorProto.INT64))
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(21)
    x = np.empty((1, 1, 32), np.float32)
    past_key, past_value = (rng.standard_normal((1, 2, 3, 16)).astype(np.float32) for _ in range(2))
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        if caches == "views":  # the same values, in memory borrowed from a wider array
            past_key, past_value = (np.concatenate([a, a], axis=-1)[..., :16] for a in (past_key, past_value))
        if caches == "strided":  # the same, through as_strided: a base that is no array
            past_key, past_value = (np.lib.stride_tricks.as_strided(np.concatenate([a, a], axis=-1), a.shape,
                                                                    (a.shape[1] * a.shape[2] * 128, a.shape[2] * 128, 128, 4))
                                    for a in (past_key, past_value))
        length = past_key.shape[2]
        feeds = {"x": x, "past_key": past_key, "past_value": past_value,
                 "seqlens_k": np.array([length], np.int32), "total_sequence_length": np.array(length + 1, np.int32),
                 "attention_mask": np.ones((1, length + 1), np.int64)}
        want = oracle.run(None, {k: np.array(v) for k, v in feeds.items()})
        got = session.run(None, feeds)
        for i, what in enumerate(("attention output", "present_key", "present_value")):
            _close(got[i], want[i], run, what)
        past_key, past_value = got[1], got[2]
    assert len(served) == RUNS
    # from the fourth step the decode-plan memo allocates the presents before the call
    # (before, the kernel makes its own): from then on, a growing cache's every call
    assert served[3:] == [caches != "strided"] * (RUNS - 3)
    assert caches != "strided" or not any(served)


def _two_layer_gqa_model(*, heads=4, kv_heads=2, head=16, capacity=24, max_pos=64):
    """Two GroupQueryAttention layers alike but for their projections, sharing the cos/sin
    initializers (so their kernels match in every key but the node), fixed caches."""
    rng = np.random.default_rng(13)
    hidden = heads * head
    width = (heads + 2 * kv_heads) * head
    angles = np.arange(max_pos)[:, None] * (1.0 / 10000 ** (np.arange(head // 2) / (head // 2)))[None]
    initializers = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
                    numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    kv_shape = [1, kv_heads, capacity, head]
    nodes, inputs, outputs = [], [_tensor("x", [1, 1, hidden])], []
    source = "x"
    for layer in range(2):
        initializers.append(numpy_helper.from_array(
            (rng.standard_normal((hidden, width)) * 0.1).astype(np.float32), f"w{layer}"))
        nodes += [helper.make_node("MatMul", [source, f"w{layer}"], [f"qkv{layer}"]),
                  helper.make_node("GroupQueryAttention",
                                   [f"qkv{layer}", "", "", f"past_key{layer}", f"past_value{layer}", "seqlens_k",
                                    "total_sequence_length", "cos", "sin"],
                                   [f"attn{layer}", f"present_key{layer}", f"present_value{layer}"],
                                   domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, do_rotary=1)]
        inputs += [_tensor(f"past_key{layer}", kv_shape), _tensor(f"past_value{layer}", kv_shape)]
        outputs += [_tensor(f"present_key{layer}", kv_shape), _tensor(f"present_value{layer}", kv_shape)]
        source = f"attn{layer}"
    inputs += [_tensor("seqlens_k", [1], TensorProto.INT32), _tensor("total_sequence_length", [], TensorProto.INT32)]
    graph = helper.make_graph(nodes, "two_gqa", inputs, [_tensor("attn1", [1, 1, hidden])] + outputs, initializers)
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8), kv_shape, hidden


def _two_layers_on_bound_caches_vs_onnxruntime(session, model, positions, after_run=lambda: None):
    """Decode runs of `_two_layer_gqa_model` at `positions` (seqlens_k), the caches bound
    in place as past and present, x new each run: every output against onnxruntime's,
    given copies of the reference caches."""
    oracle = _ort(model)
    rng = np.random.default_rng(len(positions))
    kv_shape = [d.dim_value for d in model.graph.input[1].type.tensor_type.shape.dim]
    hidden = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    x = np.empty((1, 1, hidden), np.float32)
    caches = {f"{kind}{layer}": np.zeros(kv_shape, np.float32) for layer in range(2) for kind in ("key", "value")}
    reference = {name: cache.copy() for name, cache in caches.items()}
    seqlens, total = np.empty((1,), np.int32), np.empty((), np.int32)
    attn = np.empty((1, 1, hidden), np.float32)
    binding = session.io_binding()
    for name, arr in (("x", x), ("seqlens_k", seqlens), ("total_sequence_length", total)):
        binding.bind_input(name, arr)
    binding.bind_output("attn1", attn)
    for name, cache in caches.items():
        binding.bind_input(f"past_{name}", cache)
        binding.bind_output(f"present_{name}", cache)
    for run, position in enumerate(positions):
        x[...] = rng.standard_normal(x.shape)
        seqlens[...] = position
        total[...] = position + 1
        feeds = {"x": x.copy(), "seqlens_k": seqlens.copy(), "total_sequence_length": total.copy()}
        feeds.update({f"past_{name}": cache for name, cache in reference.items()})
        want = dict(zip([o.name for o in oracle.get_outputs()], oracle.run(None, feeds)))
        session.run_with_iobinding(binding)
        _close(attn, want["attn1"], run, "attention output")
        for name, cache in caches.items():
            _close(cache, want[f"present_{name}"], run, f"present_{name}")
        reference = {name: want[f"present_{name}"] for name in caches}
        after_run()


def test_look_alike_gqa_layers_keep_their_own_prepared_call_vs_onnxruntime(monkeypatch):
    """Two GQA nodes whose kernels would match in every cache key (shapes, attributes, the
    shared cos/sin): each gets its own build, so each keeps the views prepared for its own
    arrays across steps (a shared build would re-prepare at every call, each layer
    overwriting the other's) — and every run agrees with onnxruntime."""
    prepares = []
    real = gqa_host_decode.HostDecode.prepare.__func__

    def counting(cls, *args, **kwargs):
        prepares.append(1)
        return real(cls, *args, **kwargs)
    monkeypatch.setattr(gqa_host_decode.HostDecode, "prepare", classmethod(counting))
    relu = helper.make_graph([helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["b"], ["c"])],
                             "relus", [_tensor("a", [2])], [_tensor("c", [2])])
    relus = workbench.InferenceSession(helper.make_model(relu, opset_imports=OPSET, ir_version=8))
    assert relus.executor.plan.nodes[0].fn is relus.executor.plan.nodes[1].fn, "look-alikes still share a build"

    model, _, _ = _two_layer_gqa_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    nodes = [p for p in session.executor.plan.nodes if p.node.op_type == "GroupQueryAttention"]
    assert nodes[0].fn is not nodes[1].fn
    calls_at = []
    _two_layers_on_bound_caches_vs_onnxruntime(session, model, [2 + run for run in range(RUNS)],
                                               after_run=lambda: calls_at.append(len(prepares)))
    assert calls_at[-1] == calls_at[RUNS // 2], f"prepared again at steady state: {calls_at}"
    assert (session.recording.capture_events().event == "replay").any()


def test_gqa_layers_share_one_rotation_matrix_filled_once_a_step_vs_onnxruntime(monkeypatch):
    """Layers reading the same constant cos/sin caches rotate through one shared matrix,
    refilled only when the position moves (once a step, not once a layer); positions
    that repeat and jump ahead, every run against onnxruntime. numpy's arithmetic
    (rounding "never"): by default the compiled MLAS rotation runs where numba is."""
    seen = []
    real = rotary_matrix.RotationMatrix.at

    def spy(rotation, position):
        seen.append((id(rotation), position, rotation.position != position))
        return real(rotation, position)
    monkeypatch.setattr(rotary_matrix.RotationMatrix, "at", spy)
    model, _, _ = _two_layer_gqa_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False,
                                                               onnxruntime_rounding="never"))
    positions = [2, 3, 3, 9, 10, 10, 11, 17]
    _two_layers_on_bound_caches_vs_onnxruntime(session, model, positions)
    assert len({matrix for matrix, _, _ in seen}) == 1, "the two layers must share one matrix"
    steady = seen[-2 * 5:]  # the last five runs, both layers: prepared calls throughout
    assert [position for _, position, _ in steady] == [p for p in positions[-5:] for _ in range(2)]
    refilled = [position for _, position, fill in steady if fill]
    assert refilled == [9, 10, 11, 17], "refilled once per new position, by the first layer"
    assert (session.recording.capture_events().event == "replay").any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rotation_matrix_holds_cos_and_signed_sin_where_a_rotation_puts_them(dtype):
    """R_p against the dense matrix written out by hand, and x @ R_p against the
    elementwise rotation within rounding, at positions visited out of order."""
    rng = np.random.default_rng(4)
    half = 8
    cos, sin = (rng.standard_normal((20, half)).astype(dtype) for _ in range(2))
    rotation = rotary_matrix.rotation_matrix(cos, sin)
    assert rotary_matrix.rotation_matrix(cos, sin) is rotation
    assert rotary_matrix.rotation_matrix(cos, sin.copy()) is not rotation
    for p in (3, 3, 0, 19, 7):
        dense = np.zeros((2 * half, 2 * half), dtype)
        i = np.arange(half)
        dense[i, i] = dense[i + half, i + half] = cos[p]
        dense[i + half, i] = -sin[p]
        dense[i, i + half] = sin[p]
        got = rotation.at(p)
        np.testing.assert_array_equal(got, dense)
        x = rng.standard_normal((5, 2 * half)).astype(dtype)
        elementwise = np.concatenate([x[:, :half] * cos[p] - x[:, half:] * sin[p],
                                      x[:, half:] * cos[p] + x[:, :half] * sin[p]], axis=1)
        np.testing.assert_allclose(x @ got, elementwise, rtol=1e-5, atol=1e-6)

def _sibling_matmul_model(rows, opset):
    """x feeds three MatMuls with their own weights (widths 8, 4, 12); one product is a
    graph output itself, the others feed a node each; a fourth MatMul shares x but also
    its weight with another reader, so it must stay apart."""
    rng = np.random.default_rng(21)
    weights = [numpy_helper.from_array(rng.standard_normal((6, n)).astype(np.float32), f"w{i}")
               for i, n in enumerate((8, 4, 12, 5))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["q"]),
             helper.make_node("MatMul", ["x", "w1"], ["k"]),
             helper.make_node("MatMul", ["x", "w2"], ["v"]),
             helper.make_node("MatMul", ["x", "w3"], ["shared"]),
             helper.make_node("Relu", ["q"], ["q_out"]),
             helper.make_node("Neg", ["k"], ["k_out"]),
             helper.make_node("Add", ["shared", "w3_row"], ["shared_out"]),
             helper.make_node("ReduceSum", ["w3"], ["w3_total"], keepdims=0)]
    row = numpy_helper.from_array(np.ones((5,), np.float32), "w3_row")
    graph = helper.make_graph(
        nodes, "siblings", [_tensor("x", [1, rows, 6])],
        [_tensor("q_out", [1, rows, 8]), _tensor("k_out", [1, rows, 4]), _tensor("v", [1, rows, 12]),
         _tensor("shared_out", [1, rows, 5]), _tensor("w3_total", [])],
        weights + [row])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("opset", [11, 17])
def test_sibling_matmuls_fused_vs_onnxruntime(rows, opset):
    """One MatMul over the concatenated weights and a Split (the Split-13 input form or
    the Split-11 attribute): for one row the parts are contiguous views, for three they
    are strided. Every output equals onnxruntime's, run after run on one input buffer."""
    model = _sibling_matmul_model(rows, opset)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    fused = session.recording.rewrites().query("rule == 'matmul_siblings'")
    assert len(fused) == 1 and list(fused.original_ops.iloc[0]) == ["MatMul"] * 3
    ops = [n.op_type for n in session.graph.nodes]
    assert ops.count("MatMul") == 2 and ops.count("Split") == 1, "q/k/v fused; the shared weight's MatMul apart"
    runs = runs_on_one_buffer(session, _ort(model), (1, rows, 6), RUNS, np.random.default_rng(22),
                              names=("q_out", "k_out", "v", "shared_out", "w3_total"))
    for run, name, g, w in runs:
        _close(g, w, run, name)


def test_gqa_overlap_check_agrees_with_numpy_on_views_of_owned_and_borrowed_memory():
    """The one-token path refuses presents overlapping a past; its check answers without
    numpy where two arrays' memory has different owners. On views (offsets, dtypes,
    strides) of owned buffers and of borrowed memory (np.frombuffer, twice over one
    buffer), it must agree with numpy's extent test everywhere."""
    from workbench.ops.attention_math import _overlap

    rng = np.random.default_rng(0)
    shared = bytearray(4096)
    sources = [np.empty(4096, np.uint8) for _ in range(3)]
    sources += [np.frombuffer(shared, np.uint8), np.frombuffer(shared, np.uint8)]

    def some_view():
        source = sources[rng.integers(len(sources))]
        start, n = int(rng.integers(0, 2048)), int(rng.integers(8, 2048))
        view = source[start:start + n]
        if rng.random() < 0.5:
            view = view[: view.size // 4 * 4].view(np.float32)
        return view[::2] if rng.random() < 0.3 else view

    pairs = [(some_view(), some_view()) for _ in range(3000)]
    assert [_overlap(a, b) for a, b in pairs] == [bool(np.may_share_memory(a, b)) for a, b in pairs]
    assert any(_overlap(a, b) for a, b in pairs) and not all(_overlap(a, b) for a, b in pairs)

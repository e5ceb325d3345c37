"""One named test per way a mechanism has silently changed a value.

The model is tinygrad's `test/test_jit_footguns.py`: every silent-corruption
pattern ever found gets a regression here. Each test runs the graph at least six
times with its inputs at *stable addresses* and *new contents* every run (the
way a decode loop feeds a model, and the only way a stale capture shows), under
the default options with memo verification off, and checks exact values against
onnxruntime or numpy — never against another mechanism of ours.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor

import workbench
from workbench import RunOptions, SessionOptions
from workbench.reports.plan import elided_mechanisms

RUNS = 8
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(nodes, inputs, outputs, initializers=(), opset=OPSET):
    graph = helper.make_graph(nodes, "footgun", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=opset, ir_version=8)


def _options(**kw):
    kw.setdefault("decode_memo_verify", False)  # the default a user gets
    return SessionOptions(**kw)


def _assert_exact(got, want, run, what=""):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run} {what}")


def test_capture_replay_must_not_read_a_copy_made_at_capture_time():
    """A layout node that has to materialise (Reshape of a transposed tensor) copies
    at run time; a replay that skips the copy reads the capture run's contents."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((12, 3)).astype(np.float32), "w2")
    s1 = numpy_helper.from_array(np.array([3, 2, 4], np.int64), "s1")
    s2 = numpy_helper.from_array(np.array([2, 12], np.int64), "s2")
    model = _model(
        [helper.make_node("MatMul", ["x", "w1"], ["a"]),
         helper.make_node("Reshape", ["a", "s1"], ["b"]),
         helper.make_node("Transpose", ["b"], ["c"], perm=[1, 0, 2]),
         helper.make_node("Reshape", ["c", "s2"], ["d"]),
         helper.make_node("MatMul", ["d", "w2"], ["y"])],
        [_tensor("x", [6, 4])], [_tensor("y", [2, 3])], [w1, w2, s1, s2])
    session = workbench.InferenceSession(model, _options())
    oracle = _ort(model)
    x = np.empty((6, 4), np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal((6, 4))
        (got,) = session.run(None, {"x": x})
        (want,) = oracle.run(None, {"x": x.copy()})
        _assert_exact(got, want, run)
    events = session.recording.capture_events()
    assert (events.event == "replay").any(), "the graph must actually replay for this test to bite"


def _packed_gqa_model(heads=2, kv_heads=1, head=16, hidden=32, capacity=16):
    rng = np.random.default_rng(2)
    width = (heads + 2 * kv_heads) * head
    w = numpy_helper.from_array((rng.standard_normal((hidden, width)) * 0.3).astype(np.float32), "w_qkv")
    split = numpy_helper.from_array(np.array([heads * head, kv_heads * head, kv_heads * head], np.int64), "qkv_split")
    kv_shape = [1, kv_heads, capacity, head]
    model = _model(
        [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),
         helper.make_node("Split", ["qkv", "qkv_split"], ["q", "k", "v"], axis=2),
         helper.make_node("GroupQueryAttention",
                          ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
                          ["attn", "present_key", "present_value"], domain="com.microsoft",
                          num_heads=heads, kv_num_heads=kv_heads),
         helper.make_node("Neg", ["attn"], ["y"])],
        [_tensor("x", [1, 2, hidden]), _tensor("past_key", kv_shape), _tensor("past_value", kv_shape),
         _tensor("seqlens_k", [1], TensorProto.INT32), _tensor("total_sequence_length", [], TensorProto.INT32)],
        [_tensor("y", [1, 2, heads * head]), _tensor("present_key", kv_shape), _tensor("present_value", kv_shape)],
        [w, split])
    return model, kv_shape, hidden


@pytest.mark.parametrize("slot", ["verify", "primary"])
def test_packed_qkv_split_into_gqa_with_two_query_tokens_and_kv_bound_in_place(slot):
    """The verify slot's shape: 2 query tokens, packed QKV split into views, the KV
    cache bound as its own present (fixed capacity, written in place). The Split views
    are strided, so GroupQueryAttention (which needs contiguous q/k/v) gets a contiguity
    copy before it runs: that copy must be a recorded launch, or replays read the
    capture run's q/k/v."""
    model, kv_shape, hidden = _packed_gqa_model()
    capacity = kv_shape[2]
    session = workbench.InferenceSession(model, _options())
    oracle = _ort(model)
    rng = np.random.default_rng(3)
    x = np.empty((1, 2, hidden), np.float32)
    key = np.zeros(kv_shape, np.float32)
    value = np.zeros(kv_shape, np.float32)
    seqlens = np.empty((1,), np.int32)
    total = np.array(capacity, np.int32)
    y = np.empty((1, 2, 32), np.float32)
    ref_key, ref_value = key.copy(), value.copy()
    binding = session.io_binding()
    for name, arr in (("x", x), ("past_key", key), ("past_value", value),
                      ("seqlens_k", seqlens), ("total_sequence_length", total)):
        binding.bind_input(name, arr)
    for name, arr in (("y", y), ("present_key", key), ("present_value", value)):
        binding.bind_output(name, arr)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        seqlens[...] = 2 * run + 1  # two new tokens each run: total length 2 * (run + 1)
        want = oracle.run(None, {"x": x.copy(), "past_key": ref_key, "past_value": ref_value,
                                 "seqlens_k": seqlens.copy(), "total_sequence_length": total.copy()})
        session.run_with_iobinding(binding, RunOptions(slot=slot))
        _assert_exact(y, want[0], run, "attention output")
        _assert_exact(key, want[1], run, "present_key")
        _assert_exact(value, want[2], run, "present_value")
        ref_key, ref_value = want[1], want[2]


def _if_model():
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(
        np.array([1.0, 2.0, 3.0], np.float32)))], "then", [], [_tensor("t", [3])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.array([-1.0, -2.0, -3.0], np.float32)))], "else", [], [_tensor("e", [3])])
    two = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    return _model(
        [helper.make_node("If", ["cond"], ["branch"], then_branch=then, else_branch=other),
         helper.make_node("Mul", ["branch", "two"], ["doubled"]),
         helper.make_node("Neg", ["doubled"], ["y"])],
        [_tensor("cond", [], TensorProto.BOOL)], [_tensor("y", [3])], [two])


def test_skipped_if_output_is_never_overwritten_in_place():
    """An unchanged predicate skips the If; a later elementwise node must not have
    written into the If's output buffer, or the skipped value compounds."""
    model = _if_model()
    session = workbench.InferenceSession(model, _options())
    oracle = _ort(model)
    cond = np.empty((), np.bool_)
    for run in range(RUNS):
        cond[...] = run < 4 or run % 3 == 0  # unchanged for several runs, then flips
        (got,) = session.run(None, {"cond": cond})
        (want,) = oracle.run(None, {"cond": cond.copy()})
        _assert_exact(got, want, run)


def _runtime_slice_model(width=4):
    """A growing KV input, plus a Slice whose start is computed at run time."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    table = numpy_helper.from_array(np.arange(8 * width, dtype=np.float32).reshape(8, width), "table")
    shape = numpy_helper.from_array(np.array([1, width], np.int64), "row_shape")
    return _model(
        [helper.make_node("Add", ["row", "one"], ["start"]),
         helper.make_node("Add", ["start", "one"], ["end"]),
         helper.make_node("Slice", ["table", "start", "end", "axes"], ["picked"]),
         helper.make_node("Reshape", ["picked", "row_shape"], ["picked2"]),
         helper.make_node("Mul", ["picked2", "scale"], ["scaled"]),
         helper.make_node("Unsqueeze", ["scaled", "axes"], ["new_row"]),
         helper.make_node("Concat", ["past", "new_row"], ["present"], axis=1),
         helper.make_node("ReduceSum", ["present"], ["total"], keepdims=0)],
        [_tensor("row", [1], TensorProto.INT64), _tensor("scale", [1, width]),
         _tensor("past", [1, "T", width])],
        [_tensor("present", [1, "T1", width]), _tensor("total", [])],
        [one, axes, table, shape])


@pytest.mark.parametrize("runtime_reshape", [False, True])
def test_cached_view_plan_admits_no_view_with_runtime_parameters(runtime_reshape):
    """Stage 2 reinstates views without dispatching their nodes. A Slice whose
    start comes from a runtime tensor (or a Reshape with a runtime shape) is not a
    pure function of its source buffer: changing the start must change the row."""
    width = 4
    model = _runtime_slice_model(width)
    if runtime_reshape:  # feed the Reshape's target shape as a runtime input instead
        graph = model.graph
        graph.initializer.remove(next(t for t in graph.initializer if t.name == "row_shape"))
        graph.input.append(_tensor("row_shape", [2], TensorProto.INT64))
    session = workbench.InferenceSession(model, _options())
    oracle = _ort(model)
    rng = np.random.default_rng(4)
    row = np.empty((1,), np.int64)
    scale = np.empty((1, width), np.float32)
    row_shape = np.array([1, width], np.int64)
    past = np.zeros((1, 0, width), np.float32)
    for run in range(RUNS + 2):
        row[...] = 1 if run < 4 else run % 6
        scale[...] = rng.uniform(0.5, 1.5, (1, width))
        feeds = {"row": row, "scale": scale, "past": past}
        if runtime_reshape:
            feeds["row_shape"] = row_shape
        got = session.run(None, feeds)
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        _assert_exact(got[0], want[0], run, "present")
        _assert_exact(got[1], want[1], run, "total")
        past = got[0]
    memo = session.recording.memo_timeline()
    assert (memo.action == "replayed").any(), "the memo must replay for this test to bite"


def _folded_and_runtime_reshape_model(width=4):
    """Two Reshapes of one projection: one to a shape the graph computes from shapes
    alone (Shape -> Gather -> Div -> Unsqueeze -> Concat: folded on replays), one to a
    shape fed at run time; each is transposed and flattened (the values' order shows
    the shape), summed into the new row of a growing cache."""
    rng = np.random.default_rng(12)
    consts = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "w"),
              numpy_helper.from_array(np.array(1, np.int64), "one"),
              numpy_helper.from_array(np.array(2, np.int64), "two"),
              numpy_helper.from_array(np.array([0], np.int64), "axes0"),
              numpy_helper.from_array(np.array([1], np.int64), "axes1")]
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Shape", ["h"], ["h_shape"]),
         helper.make_node("Gather", ["h_shape", "one"], ["h_width"]),
         helper.make_node("Div", ["h_width", "two"], ["half"]),
         helper.make_node("Unsqueeze", ["half", "axes0"], ["half_1d"]),
         helper.make_node("Concat", ["half_1d", "half_1d"], ["square"], axis=0),
         helper.make_node("Reshape", ["h", "square"], ["h_square"]),
         helper.make_node("Transpose", ["h_square"], ["h_square_t"]),
         helper.make_node("Flatten", ["h_square_t"], ["folded_row"], axis=0),
         helper.make_node("Reshape", ["h", "fed_shape"], ["h_fed"]),
         helper.make_node("Transpose", ["h_fed"], ["h_fed_t"]),
         helper.make_node("Flatten", ["h_fed_t"], ["fed_row"], axis=0),
         helper.make_node("Add", ["folded_row", "fed_row"], ["row"]),
         helper.make_node("Unsqueeze", ["row", "axes1"], ["new_row"]),
         helper.make_node("Concat", ["past", "new_row"], ["present"], axis=1)],
        [_tensor("x", [1, width]), _tensor("fed_shape", [2], TensorProto.INT64), _tensor("past", [1, "T", width])],
        [_tensor("present", [1, "T1", width])],
        consts)


@pytest.mark.parametrize("capture", [False, True])
def test_cached_view_plan_trusts_identity_only_for_folded_shape_parameters(capture):
    """Stage 2 skips recomputing a Reshape's parameter key while its shape input is the
    very shape-fold value it was checked on (a private copy no kernel writes). A shape
    fed at run time, in one buffer whose contents change, is still read every step: the
    fed Reshape's values must follow its new shape, the folded one's stay right. (With
    capture, the nodes replay inside a segment instead; the values must hold too.)"""
    width = 4
    model = _folded_and_runtime_reshape_model(width)
    session = workbench.InferenceSession(model, _options(capture=capture))
    oracle = _ort(model)
    rng = np.random.default_rng(9)
    x = np.empty((1, width), np.float32)
    fed_shape = np.empty((2,), np.int64)
    past = np.zeros((1, 0, width), np.float32)
    names = {p.index: session.executor.graph.values[p.outputs[0]].name for p in session.executor.plan.nodes}
    kept_by_identity = set()
    for run in range(RUNS + 4):
        x[...] = rng.standard_normal((1, width))
        fed_shape[...] = [2, 2] if run < 6 else ([1, 4] if run % 2 else [4, 1])
        feeds = {"x": x, "fed_shape": fed_shape, "past": past}
        got = session.run(None, feeds)
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        _assert_exact(got[0], want[0], run, "present")
        past = got[0]
        plan = session.executor.state.view_plan
        if plan is not None:
            kept_by_identity |= {names[k] for k in plan.same_source}
    stats = session.memo_stats()
    assert stats["replayed"] >= 4 and stats["shape_folded"] > 0, stats
    if not capture:
        assert "h_square" in kept_by_identity, "the folded-shape Reshape must take the identity path to bite"
    assert "h_fed" not in kept_by_identity


def test_cached_view_plan_notices_a_source_buffer_replaced_between_steps():
    """The Stage 2 guard passes a step on the identity of the source buffers it last
    found in place. A buffer replaced by another array (same shape, new contents and
    address) must fail it: the views are then taken afresh, and every value stays right."""
    width = 4
    model = _folded_and_runtime_reshape_model(width)
    session = workbench.InferenceSession(model, _options(capture=False))
    oracle = _ort(model)
    executor = session.executor
    rng = np.random.default_rng(10)
    x = np.empty((1, width), np.float32)
    fed_shape = np.array([2, 2], np.int64)
    past = np.zeros((1, 0, width), np.float32)
    replaced = 0
    for run in range(RUNS + 4):
        plan = executor.state.view_plan
        if run in (6, 9) and plan is not None and plan.validated and plan.held_sources is not None:
            for owner in plan.sources:
                if owner in executor.state.buffers:  # garbage in a new array where the old one was
                    executor.state.buffers[owner] = np.full_like(executor.state.buffers[owner], -7)
                    replaced += 1
        x[...] = rng.standard_normal((1, width))
        feeds = {"x": x, "fed_shape": fed_shape, "past": past}
        got = session.run(None, feeds)
        want = oracle.run(None, {k: v.copy() for k, v in feeds.items()})
        _assert_exact(got[0], want[0], run, "present")
        past = got[0]
    assert replaced >= 2, "the guard's identity path must be in use for this to bite"
    reasons = session.recording.memo_timeline().reason
    assert reasons.str.contains("moved or resized").sum() >= 2


# -- found by reading ------------------------------------------------------------------


def _growing_model():
    """A growing KV-like input and a fixed-shape part: the memo replays from step 2."""
    w = numpy_helper.from_array(np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32), "w")
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Tanh", ["h"], ["t"]),
         helper.make_node("Relu", ["t"], ["r"]),
         helper.make_node("Unsqueeze", ["r", "axes"], ["row"]),
         helper.make_node("Concat", ["past", "row"], ["present"], axis=1),
         helper.make_node("ReduceSum", ["present", "axes"], ["y"], keepdims=0)],
        [_tensor("x", [1, 4]), _tensor("past", [1, "T", 4])],
        [_tensor("present", [1, "T1", 4]), _tensor("y", [1, 4])],
        [w, numpy_helper.from_array(np.array([1], np.int64), "axes")])


def _decode_growing(session, oracle, runs=RUNS):
    rng = np.random.default_rng(6)
    x = np.empty((1, 4), np.float32)
    past = np.zeros((1, 0, 4), np.float32)
    for run in range(runs):
        x[...] = rng.standard_normal((1, 4))
        got = session.run(None, {"x": x, "past": past})
        want = oracle.run(None, {"x": x.copy(), "past": past.copy()})
        for g, w in zip(got, want):
            _assert_exact(g, w, run)
        past = got[0]


def test_memo_replay_honours_a_replan_request():
    """A kernel that cannot write into its preallocated buffer is retried without
    it and marked for just-in-time allocation; a memo replay must not keep handing it
    the preallocated buffer (failing and retrying every step)."""
    model = _growing_model()
    session = workbench.InferenceSession(model, _options(capture=False))
    victim = next(p for p in session.plan.nodes if p.node.op_type == "Tanh")
    original = victim.fn
    preallocated_calls = []

    def picky(ins, outs):  # shape inference "was wrong" for this node
        if outs[0] is not None:
            preallocated_calls.append(len(preallocated_calls))
            raise ValueError("output buffer has the wrong shape")
        return original(ins, outs)

    victim.fn = picky
    _decode_growing(session, _ort(model))
    assert len(preallocated_calls) == 1, "one failure, then just-in-time allocation for good"
    memo = session.recording.memo_timeline()
    assert memo.reason.str.startswith("re-plan requested: ").sum() == 1
    assert (memo.action == "replayed").any(), "the memo still replays after the re-plan"


def _fixed_model():
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]),
         helper.make_node("Tanh", ["a"], ["b"]),
         helper.make_node("MatMul", ["b", "w"], ["c"]),
         helper.make_node("Sigmoid", ["c"], ["y"])],
        [_tensor("x", [2, 4])], [_tensor("y", [2, 4])], [w])


def _run_fixed(session, oracle, runs=RUNS):
    rng = np.random.default_rng(8)
    x = np.empty((2, 4), np.float32)
    for run in range(runs):
        x[...] = rng.standard_normal((2, 4))
        (got,) = session.run(None, {"x": x})
        (want,) = oracle.run(None, {"x": x.copy()})
        _assert_exact(got, want, run)


def test_quarantine_names_the_node_that_read_the_host_not_the_last_one_run():
    model = _fixed_model()
    session = workbench.InferenceSession(model, _options(min_segment_nodes=1))
    reader = next(p for p in session.plan.nodes if p.node.op_type == "Tanh")
    original = reader.fn

    def syncs(ins, outs):
        out = original(ins, outs)
        workbench.ops.registry.host_read(out[0])  # after its own work: the next node is not at fault
        return out

    reader.fn = syncs
    _run_fixed(session, _ort(model))
    assert session.executor.capture_runner.quarantined == {("", "Tanh")}
    events = session.recording.capture_events()
    assert events[events.event == "quarantine"].reason.str.startswith("Tanh").all()


def test_a_kernel_bug_while_capturing_is_a_kernel_error_naming_its_node():
    model = _fixed_model()
    session = workbench.InferenceSession(model, _options(min_segment_nodes=1))
    victim = next(p for p in session.plan.nodes if p.node.op_type == "Sigmoid")
    original = victim.fn
    calls = []

    def breaks_second_time(ins, outs):
        calls.append(1)
        if len(calls) == 2:  # run 1 is the warm-up, run 2 records
            raise IndexError("kernel bug")
        return original(ins, outs)

    victim.fn = breaks_second_time
    x = np.ones((2, 4), np.float32)
    session.run(None, {"x": x})
    with pytest.raises(workbench.KernelError, match=r"Sigmoid.*IndexError: kernel bug") as info:
        session.run(None, {"x": x})
    assert info.value.plan_index == victim.index
    assert session.executor.capture_runner.quarantined == set(), "a kernel bug is not a host read"
    events = session.recording.capture_events()
    assert events[events.event == "retire"].reason.str.startswith("kernel_error").any()
    _run_fixed(session, _ort(model))  # and the session keeps working afterwards


def test_a_capture_api_failure_retires_with_its_own_reason_and_the_step_completes(monkeypatch):
    model = _fixed_model()
    session = workbench.InferenceSession(model, _options(min_segment_nodes=1))
    backend = session.backend
    original = backend.end_capture
    failures = []

    def refuses_once(graph):
        if not failures:
            failures.append(1)
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        return original(graph)

    monkeypatch.setattr(backend, "end_capture", refuses_once)
    _run_fixed(session, _ort(model))
    events = session.recording.capture_events()
    retire = events[events.event == "retire"].reason
    assert retire.str.startswith("capture_api_error: RuntimeError: cudaErrorStreamCaptureInvalidated").any()
    assert session.executor.capture_runner.quarantined == set()
    assert (events.event == "replay").any(), "captured again on a later step, and replayed"


# -- found by the differential fuzzer (tests/fuzz) -------------------------------------


def test_a_layout_node_writing_a_caller_bound_output_is_replayed():
    """A bound output produced by a layout node (Unsqueeze of a graph input) is a
    copy into the caller's array: a captured replay must redo it."""
    model = _model(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["y"]),
         helper.make_node("Neg", ["x"], ["n"]),
         helper.make_node("Tanh", ["n"], ["z"])],
        [_tensor("x", [2, 3])], [_tensor("y", [1, 2, 3]), _tensor("z", [2, 3])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    session = workbench.InferenceSession(model, _options(min_segment_nodes=1))
    oracle = _ort(model)
    rng = np.random.default_rng(9)
    x = np.empty((2, 3), np.float32)
    y = np.empty((1, 2, 3), np.float32)
    z = np.empty((2, 3), np.float32)
    binding = session.io_binding()
    binding.bind_input("x", x)
    binding.bind_output("y", y)
    binding.bind_output("z", z)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        session.run_with_iobinding(binding)
        want = oracle.run(None, {"x": x.copy()})
        _assert_exact(y, want[0], run, "y")
        _assert_exact(z, want[1], run, "z")
    assert (session.recording.capture_events().event == "replay").any()


def test_a_layout_result_never_aliases_an_input_that_is_later_overwritten_in_place():
    """With views off the storage plan treats a Slice's output as its own buffer; a
    kernel result that still aliases the input would be overwritten by an in-place
    write into that (dead) input."""
    starts = numpy_helper.from_array(np.array([1], np.int64), "one")
    model = _model(
        [helper.make_node("Tanh", ["x"], ["s"]),  # negative values: the Abs below changes them
         helper.make_node("Add", ["idx", "one"], ["end"]),
         helper.make_node("Slice", ["s", "idx", "end"], ["row"]),
         helper.make_node("Abs", ["s"], ["a"]),
         helper.make_node("Relu", ["row"], ["r"]),
         helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0)],
        [_tensor("x", [4, 3]), _tensor("idx", [1], TensorProto.INT64)],
        [_tensor("r", [1, 3]), _tensor("total", [])], [starts])
    for views in (False, True):
        session = workbench.InferenceSession(model, _options(views=views))
        oracle = _ort(model)
        rng = np.random.default_rng(10)
        x = np.empty((4, 3), np.float32)
        idx = np.empty((1,), np.int64)
        for run in range(RUNS):
            x[...] = rng.standard_normal(x.shape) * 3
            idx[...] = run % 4
            got = session.run(None, {"x": x, "idx": idx})
            want = oracle.run(None, {"x": x.copy(), "idx": idx.copy()})
            for g, w in zip(got, want):
                _assert_exact(g, w, run, f"views={views}")


# -- found while decoding exporters' models --------------------------------------------


def test_an_if_branch_reading_an_outer_constant_keeps_its_type():
    """optimum's merger keeps small constants (ReduceMean's axes) as outer-scope
    initializers; inside the branch that value once had no dtype, so the kernel took
    the `axes` input for omitted and reduced every axis."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    branch = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=0)],
                               "then", [], [_tensor("m", None)])
    other = helper.make_graph([helper.make_node("ReduceMax", ["x", "axes"], ["m2"], keepdims=0)],
                              "else", [], [_tensor("m2", None)])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
                   [_tensor("x", [2, 3]), _tensor("cond", [], TensorProto.BOOL)], [_tensor("y", None)],
                   [axes], opset=[helper.make_opsetid("", 18)])
    session = workbench.InferenceSession(model, _options())
    oracle = _ort(model)
    rng = np.random.default_rng(11)
    x = np.empty((2, 3), np.float32)
    cond = np.empty((), np.bool_)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        cond[...] = run % 3 != 2
        (got,) = session.run(None, {"x": x, "cond": cond})
        (want,) = oracle.run(None, {"x": x.copy(), "cond": cond.copy()})
        assert got.shape == want.shape == (2,)
        _assert_exact(got, want, run)


def _fold_decode(seed: int, after_each=None, width: int = 4):
    """RUNS decode steps of `_folded_and_runtime_reshape_model` (the Div halving the width
    written in place over the Gather's buffer), x refilled in place, each against
    onnxruntime; `after_each(session)` runs after every step. Returns the session."""
    model = _folded_and_runtime_reshape_model(width)
    session = workbench.InferenceSession(model, _options(capture=False))
    oracle = _ort(model)
    rng = np.random.default_rng(seed)
    x, fed_shape, past = np.empty((1, width), np.float32), np.array([2, 2], np.int64), np.zeros((1, 0, width), np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal((1, width))
        feeds = {"x": x, "fed_shape": fed_shape, "past": past}
        got = session.run(None, feeds)
        _assert_exact(got[0], oracle.run(None, {k: v.copy() for k, v in feeds.items()})[0], run, "present")
        past = got[0]
        if after_each is not None:
            after_each(session)
    return session


def test_the_plan_report_calls_a_fold_fed_by_an_overwritten_value_a_shape_fold():
    """The Div halving the width is written in place over the Gather's buffer: the Gather
    is left out of the fold and runs every replay, the Div is folded. The report names
    the elisions after it shape folds (before, the Gather that ran broke the chain, and
    the Unsqueeze of the Div, a view op, read as Stage 2)."""
    session = _fold_decode(seed=3)
    executor = session.executor
    by_name = {executor.graph.values[p.outputs[0]].name: p.index for p in executor.plan.nodes}
    assert executor.state.storage.storage[executor.graph.by_name["half"]] == "alias", "the Div runs in place"
    mechanisms = elided_mechanisms(session.recording)
    last = max(step for step, _ in mechanisms)
    assert (last, by_name["h_width"]) not in mechanisms, "the overwritten Gather runs"
    # the Unsqueeze is a view op: only the chain from the Shape tells its fold from Stage 2
    assert [mechanisms[(last, by_name[v])] for v in ("half", "half_1d", "square")] == ["shape fold"] * 3


def test_a_shape_fold_that_fails_its_check_is_dropped_and_says_why():
    """A fold whose copied value is not what the kernels compute at the next replay (a
    misjudged value; here one of its copies is altered) is dropped before it serves a
    step, every value stays onnxruntime's, and the memo row of that step names the value
    and both contents: a fold that never serves must not go unnoticed."""
    altered = []

    def alter_the_fold_once(session):
        fold = session.executor.state.shape_fold
        if not altered and fold is not None and not fold.validated:
            vid = next(v for v in fold.values if session.executor.graph.values[v].name == "half")
            fold.values[vid], fold.host[vid] = fold.values[vid] + 1, fold.host[vid] + 1
            altered.append(vid)

    session = _fold_decode(seed=5, after_each=alter_the_fold_once)
    assert altered, "a fold must be built for this to bite"
    reasons = session.recording.memo_timeline().reason.tolist()
    dropped = [r for r in reasons if "shape fold dropped" in r]
    assert dropped == ["bindings match the memo; shape fold dropped: 'half' was 3 at the reference step, "
                       "2 at this replay"], reasons
    assert session.memo_stats()["shape_folded"] == 0, "dropped at its check, the fold never served a step"

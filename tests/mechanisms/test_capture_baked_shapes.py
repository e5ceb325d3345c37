"""Capture bakes validated shape-fold values: a Reshape (or any node declining capture
only for reading its shape / axes input on the host) whose host-read inputs are shape
arithmetic the memo folds joins a captured segment, its read taken as a constant.

Sound only while those values are the same at every replay: they are functions of
shapes that name no varying symbol, checked once against the kernels before anything
is baked, and any step that is not a memo replay retires every recording. The tests
run decode loops at stable addresses with new contents, step by step against
onnxruntime, through a change of batch (the baked shape would be wrong) and back.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor

import workbench
from workbench import Generator, SessionOptions, models
from workbench.ops.registry import CaptureViolation, host_read, recording_launches

OPSET = [helper.make_opsetid("", 17)]
PROMPT = [3, 7, 11, 5]


def _decode_model():
    """y = Reshape(Relu(x), Concat(Shape(x)[0], [2, 2])) * w, present = past ++ x: the
    Reshape's shape is shape arithmetic of x (batch only), the cache grows each step."""
    w = numpy_helper.from_array(np.array([[1.5, -2.0], [0.5, 3.0]], np.float32), "w")
    tail = numpy_helper.from_array(np.array([2, 2], np.int64), "tail")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    axes0 = numpy_helper.from_array(np.array([0], np.int64), "axes0")
    axes1 = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch_1d"]),
        helper.make_node("Concat", ["batch_1d", "tail"], ["target"], axis=0),
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Reshape", ["h", "target"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["y"]),
        helper.make_node("Unsqueeze", ["x", "axes1"], ["x_row"]),
        helper.make_node("Concat", ["past", "x_row"], ["present"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "baked", [_tensor("x", ["batch", 4]), _tensor("past", ["batch", "past_len", 4])],
        [_tensor("y", ["batch", 2, 2]), _tensor("present", ["batch", "total_len", 4])],
        [w, tail, zero, axes0, axes1])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _loop(session, oracle, rng, batches):
    """A decode loop per batch size: the same x buffer each step, new contents, the
    present fed back as the past; every output compared with onnxruntime's."""
    for batch, steps in batches:
        x = np.empty((batch, 4), np.float32)
        past = rng.standard_normal((batch, 2, 4)).astype(np.float32)
        for step in range(steps):
            x[...] = rng.standard_normal((batch, 4))
            got = session.run(None, {"x": x, "past": past})
            want = oracle.run(None, {"x": x.copy(), "past": past.copy()})
            for name, a, b in zip(("y", "present"), got, want):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"batch {batch} step {step} {name}")
            past = got[1]


def _reshape_index(session):
    return next(p.index for p in session.plan.nodes if p.node.op_type == "Reshape")


@pytest.mark.parametrize("options", [{}, {"decode_memo_verify": False}])
def test_a_folded_reshape_is_captured_and_every_step_is_onnxruntimes(options):
    model = _decode_model()
    session = workbench.InferenceSession(model, SessionOptions(**options))
    _loop(session, _ort(model), np.random.default_rng(0), [(1, 10)])
    rec = session.recording
    events = rec.capture_events()
    baked = events[events.event == "bake"]
    assert len(baked) == 1 and "Reshape" in baked.reason.iloc[0] and "target" in baked.reason.iloc[0]
    reshape = _reshape_index(session)
    last = rec.segments()[rec.segments().step == len(rec) - 1]
    (holding,) = [s for s in last.itertuples() if s.first_node <= reshape <= s.last_node]
    assert (holding.kind, holding.state) == ("captured", "replayed")
    assert reshape not in set(rec.capture_declines().plan_index)
    assert (events.event == "replay").sum() >= 5


def test_a_batch_change_retires_the_baked_shape_and_stays_exact():
    """Batch 1, then 3 (the baked [1, 2, 2] would be wrong), then 1 again: each run is
    onnxruntime's; the recording is retired and the shape baked afresh."""
    model = _decode_model()
    session = workbench.InferenceSession(model)
    _loop(session, _ort(model), np.random.default_rng(1), [(1, 8), (3, 8), (1, 8)])
    events = session.recording.capture_events()
    assert (events.event == "bake").sum() >= 2, "baked again after the batch changed"
    retired = events[events.event == "retire"]
    assert len(retired) >= 2 and retired.reason.str.startswith("buffers_reallocated").all(), retired.reason.tolist()


def test_without_a_shape_fold_the_shape_arithmetic_inside_the_segment_is_baked_and_exact():
    """No fold to trust (the optimizer below "extended"): the Reshape's target is still
    computed inside the captured segment from the shape of its input x, which every
    replay checks, so the recording bakes it as shape arithmetic
    (`capture.shape_derived_values`) and the Reshape replays; every step is
    onnxruntime's. Before, it stayed a host_read seam. With the memo off a growing
    decode never steadies: nothing is recorded, nothing baked."""
    model = _decode_model()
    session = workbench.InferenceSession(model, SessionOptions(graph_optimization_level="basic"))
    _loop(session, _ort(model), np.random.default_rng(2), [(1, 8)])
    rec = session.recording
    bakes = rec.capture_events()
    bakes = bakes[bakes.event == "bake"]
    assert len(bakes) == 1 and "shape arithmetic computed inside the captured segments" in bakes.reason.iloc[0], \
        bakes.reason.tolist()
    reshape = _reshape_index(session)
    timings = rec.node_timings()
    assert "replayed" in set(timings[timings.plan_index == reshape]["mode"])
    assert reshape not in set(rec.capture_declines().plan_index)

    session = workbench.InferenceSession(model, SessionOptions(decode_memo=False))
    _loop(session, _ort(model), np.random.default_rng(2), [(1, 8)])
    events = session.recording.capture_events()
    assert not events.event.isin(["bake", "capture", "replay"]).any(), events.event.tolist()


@pytest.mark.parametrize("kv", ["growing", "fixed"])
def test_torch_style_llama_decodes_like_onnxruntime_with_baked_shapes(kv):
    """The torch-export idiom (q/k/v Reshape to a Concat of Shape/Gather values): the
    reshapes join captured segments, tokens and every step's logits are onnxruntime's."""
    data = models.llama("tiny", flavor="onnx").SerializeToString()
    session = workbench.InferenceSession(data)
    got = Generator(session).generate(PROMPT, 10, kv=kv, progress=False, eos_token_id=-1, return_logits=True)
    want = Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(
        PROMPT, 10, kv=kv, progress=False, eos_token_id=-1, return_logits=True)
    assert got.tokens == want.tokens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
    events = session.recording.capture_events()
    assert (events.event == "bake").sum() > 0
    declines = session.recording.capture_declines()
    last = declines[declines.step == declines.step.max()]
    assert not any("q/Reshape" in n for n in last[last.reason == "host_read"].node)


def test_a_recording_bakes_only_the_arrays_it_was_handed():
    shape = np.array([2, 3], np.int64)
    host_copy = shape.copy()
    with recording_launches("test", {id(shape): (shape, host_copy)}):
        assert host_read(shape) is host_copy
        with pytest.raises(CaptureViolation):
            host_read(shape.copy())  # equal values, another array: not baked
    with pytest.raises(CaptureViolation):
        with recording_launches("plain"):
            host_read(shape)
    assert host_read(shape) is not host_copy  # outside a recording: read as it is


@pytest.mark.cuda
def test_on_the_device_nothing_baked_is_read_back_while_recording():
    """The device discipline: a recording may not copy device to host. The baked reads,
    and Stage 2's guard of a view's baked parameters, use the fold's host copies, so
    the capture goes through at the first try and replays; tokens are onnxruntime's."""
    data = models.llama("tiny", flavor="onnx").SerializeToString()
    session = workbench.InferenceSession(data, backend="cuda")
    got = Generator(session).generate(PROMPT, 10, kv="fixed", progress=False, eos_token_id=-1)
    want = Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(
        PROMPT, 10, kv="fixed", progress=False, eos_token_id=-1)
    assert got.tokens == want.tokens
    events = session.recording.capture_events()
    assert (events.event == "bake").sum() > 0 and (events.event == "replay").sum() > 0
    assert not events.event.isin(["retire", "quarantine"]).any(), events[events.event == "retire"].reason.tolist()


def _sliced_shape_model():
    """torch.onnx dynamo's spelling: the Reshape's batch is Shape(past, start=0, end=1),
    a slice of a growing cache's shape that takes only its fixed dim; and the positions
    Range(0, width) + past_len, the Add written in place into the Range's buffer (the
    Range is shape arithmetic, its buffer then holds the positions; the exporter
    declares both shapes, as dynamo does, so the two match and the Add may reuse it)."""
    w = numpy_helper.from_array(np.array([[1.5, -2.0], [0.5, 3.0]], np.float32), "w")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in (("tail", [2, 2]), ("zero", 0), ("one", 1), ("axes1", [1]))]
    nodes = [
        helper.make_node("Shape", ["past"], ["batch_1d"], start=0, end=1),
        helper.make_node("Concat", ["batch_1d", "tail"], ["target"], axis=0),
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Reshape", ["h", "target"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["y"]),
        helper.make_node("Shape", ["x"], ["width_1d"], start=-1),
        helper.make_node("Squeeze", ["width_1d"], ["width"]),
        helper.make_node("Range", ["zero", "width", "one"], ["offsets"]),
        helper.make_node("Shape", ["past"], ["past_len_1d"], start=1, end=2),
        helper.make_node("Squeeze", ["past_len_1d"], ["past_len"]),
        helper.make_node("Add", ["offsets", "past_len"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=1),
        helper.make_node("Add", ["x", "positions_f"], ["z"]),
        helper.make_node("Unsqueeze", ["x", "axes1"], ["x_row"]),
        helper.make_node("Concat", ["past", "x_row"], ["present"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "sliced", [_tensor("x", ["batch", 4]), _tensor("past", ["batch", "past_len", 4])],
        [_tensor("y", ["batch", 2, 2]), _tensor("z", ["batch", 4]), _tensor("present", ["batch", "total_len", 4])],
        [w, *consts], value_info=[_tensor("offsets", [4], TensorProto.INT64), _tensor("positions", [4], TensorProto.INT64)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_a_shape_slice_of_a_growing_cache_folds_and_an_overwritten_value_stays_out():
    """The batch sliced from the growing past's shape folds (its dim names no varying
    symbol), so the Reshape is baked and captured; the Range, whose buffer the
    positions' Add overwrites in place, is left out of the fold (its buffer holds the
    positions by the end of the step: before, that failed the fold's check and the
    whole fold went). Every step onnxruntime's, x refilled in place, the cache growing."""
    model = _sliced_shape_model()
    session = workbench.InferenceSession(model)
    oracle, rng = _ort(model), np.random.default_rng(4)
    x, past = np.empty((1, 4), np.float32), rng.standard_normal((1, 2, 4)).astype(np.float32)
    for step in range(10):
        x[...] = rng.standard_normal((1, 4))
        got = session.run(None, {"x": x, "past": past})
        want = oracle.run(None, {"x": x.copy(), "past": past.copy()})
        for name, a, b in zip(("y", "z", "present"), got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"step {step} {name}")
        past = got[2]
    executor = session.executor
    fold, values = executor.state.shape_fold, executor.graph.values
    assert fold is not None and fold.validated
    folded = {values[o].name for o in fold.values}
    assert {"batch_1d", "target", "width"} <= folded and not {"offsets", "positions", "past_len"} & folded, folded
    assert executor.state.storage.storage[executor.graph.by_name["positions"]] == "alias", "the Add runs in place"
    events = session.recording.capture_events()
    baked = events[events.event == "bake"].reason.tolist()
    assert any(r.startswith("Reshape") and "target" in r for r in baked), baked
    reshape = _reshape_index(session)
    timings = session.recording.node_timings()
    assert "replayed" in set(timings[timings.plan_index == reshape]["mode"])

"""Captured graphs hold on the exports people bring: a value made outside the captured
segments keeps its address, a shape that moves between warm-up steps is a seam before
anything is recorded, a plain `run` loop replays, and a segment that keeps being
retired stops being recorded, with the reason.

Each pattern is one real exporter's idiom (optimum's Range positions, torch.onnx's
embedding Gather behind a Reshape, its growing mask Add, onnxruntime's fused GQA
layout), differential against onnxruntime over at least 8 runs; the inputs sit at
stable addresses with changing contents unless the test is about fresh arrays. On the
CPU backend and on backend="cuda" (the device double in CI).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import Generator, SessionOptions, models, reports
from workbench.decode.interface import find_export
from workbench.models import exports

RUNS = 10
WIDTH = 8
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _ort(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _mlp_nodes(x: str, out: str) -> tuple[list, list]:
    """x [.., WIDTH] -> MatMul -> Relu -> MatMul -> Add x: a run capture records whole."""
    rng = np.random.default_rng(7)
    w1 = _const("w1", rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
    w2 = _const("w2", rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
    nodes = [helper.make_node("MatMul", [x, "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]), helper.make_node("Add", ["o", x], [out])]
    return nodes, [w1, w2]


def _model(nodes, inputs, outputs, inits, opset: int = 17, value_info=()) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits, value_info=list(value_info)),
                             opset_imports=[helper.make_opsetid("", opset)])


def range_positions() -> onnx.ModelProto:
    """optimum: position ids are Range(position, position + seq), read on the host and
    sized just in time (a seam), then an embedding Gather and the layers read them."""
    nodes = [helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
             helper.make_node("Gather", ["ids_shape", "one"], ["seq"], axis=0),
             helper.make_node("Squeeze", ["position"], ["start"]),
             helper.make_node("Add", ["start", "seq"], ["limit"]),
             helper.make_node("Range", ["start", "limit", "one"], ["positions"]),
             helper.make_node("Gather", ["pos_table", "positions"], ["pos_emb"], axis=0),
             # a captured reader of the just-in-time value: its own shape is known
             helper.make_node("ReduceMean", ["pos_emb"], ["pos_row"], axes=[0], keepdims=1),
             helper.make_node("Gather", ["tok_table", "input_ids"], ["tok_emb"], axis=0),
             helper.make_node("Add", ["tok_emb", "pos_row"], ["x"])]
    mlp, weights = _mlp_nodes("x", "y")
    rng = np.random.default_rng(1)
    inits = [_const("one", np.int64(1)), _const("pos_table", rng.standard_normal((64, WIDTH)).astype(np.float32)),
             _const("tok_table", rng.standard_normal((32, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp,
                  [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
                   helper.make_tensor_value_info("position", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", WIDTH])], inits)


def sliding_window() -> onnx.ModelProto:
    """A row of a table at a fed offset (a rotary table sliced by position): a zero-copy
    view whose address moves with the offset every step."""
    nodes = [helper.make_node("Add", ["start", "one"], ["stop"]),
             helper.make_node("Slice", ["table", "start", "stop", "zero"], ["row"]),
             # a captured reader of the view: a scalar, whatever the view's shape
             helper.make_node("ReduceMean", ["row"], ["scale"], keepdims=0),
             helper.make_node("Mul", ["base", "scale"], ["x"])]
    mlp, weights = _mlp_nodes("x", "y")
    rng = np.random.default_rng(6)
    inits = [_const("one", np.array([1], np.int64)), _const("zero", np.array([0], np.int64)),
             _const("base", rng.standard_normal((1, WIDTH)).astype(np.float32)),
             _const("table", rng.standard_normal((64, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("start", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], inits)


def reshaped_embedding() -> onnx.ModelProto:
    """torch.onnx legacy gpt2: input_ids reshaped by a shape computed from values at run
    time (here the token count, summed), then the embedding Gather: its output is sized
    just in time, a fresh array each step, and the layers read it."""
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ids_f", "zero_f"], ["zeros"]),
             helper.make_node("Add", ["zeros", "one_f"], ["ones"]),
             helper.make_node("ReduceSum", ["ones"], ["count_f"], keepdims=0),
             helper.make_node("Cast", ["count_f"], ["count"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["count", "zero"], ["count1"]),
             helper.make_node("Concat", ["minus1", "count1"], ["target"], axis=0),
             helper.make_node("Reshape", ["input_ids", "target"], ["ids2"]),
             helper.make_node("Gather", ["wte", "ids2"], ["emb"], axis=0),
             # the layers' first node reads the just-in-time value; its own shape is known
             helper.make_node("ReduceMean", ["emb"], ["scale"], keepdims=0),
             helper.make_node("Mul", ["base", "scale"], ["x"])]
    mlp, weights = _mlp_nodes("x", "y")
    rng = np.random.default_rng(2)
    inits = [_const("zero", np.array([0], np.int64)), _const("minus1", np.array([-1], np.int64)),
             _const("base", rng.standard_normal((1, WIDTH)).astype(np.float32)),
             _const("zero_f", np.float32(0)), _const("one_f", np.float32(1)),
             _const("wte", rng.standard_normal((32, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], inits)


def growing_mask() -> onnx.ModelProto:
    """torch.onnx legacy: a mask of the total length (ConstantOfShape of a computed shape,
    then Add) grows every step; the layers after it do not."""
    nodes = [helper.make_node("Shape", ["past"], ["past_shape"]),
             helper.make_node("Gather", ["past_shape", "one"], ["past_len"], axis=0),
             helper.make_node("Add", ["past_len", "one"], ["total"]),
             helper.make_node("Unsqueeze", ["total", "zero"], ["total1"]),
             helper.make_node("Concat", ["ones3", "total1"], ["mask_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["mask_shape"], ["zeros"],
                              value=numpy_helper.from_array(np.zeros(1, np.float32))),
             helper.make_node("Add", ["zeros", "bias"], ["mask"]),
             helper.make_node("Softmax", ["mask"], ["weights"], axis=-1),
             helper.make_node("ReduceMax", ["weights"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["x", "peak"], ["xs"]),
             helper.make_node("Concat", ["past", "xs"], ["present"], axis=1)]
    mlp, weights = _mlp_nodes("xs", "y")
    inits = [_const("one", np.int64(1)), _const("zero", np.array([0], np.int64)),
             _const("ones3", np.array([1, 1, 1], np.int64)), _const("bias", np.float32(0.5)), *weights]
    return _model(nodes + mlp,
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, WIDTH]),
                   helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "past_len", WIDTH])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, WIDTH]),
                   helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, "total", WIDTH])], inits)


class _Runs:
    """One session and onnxruntime: `step(feeds)` runs both and compares every output."""

    def __init__(self, proto: onnx.ModelProto, backend: str, **options):
        self.session = workbench.InferenceSession(proto.SerializeToString(), backend=backend,
                                                  options=SessionOptions(trace=True, **options))
        self.peer = _ort(proto)
        self.names = [o.name for o in proto.graph.output]

    def step(self, feeds: dict, label: str) -> dict:
        got = dict(zip(self.names, self.session.run(self.names, feeds)))
        want = dict(zip(self.names, self.peer.run(self.names, {k: np.array(v) for k, v in feeds.items()})))
        for name in self.names:
            assert got[name].shape == want[name].shape, (label, name)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=f"{label}: {name}")
        return got

    def refilled(self, shape: tuple, seed: int) -> np.random.Generator:
        """RUNS steps on one input array `x` of `shape`, refilled in place each run (one
        address, new contents); returns the generator for later draws."""
        rng = np.random.default_rng(seed)
        x = np.zeros(shape, np.float32)
        for run in range(RUNS):
            x[...] = rng.standard_normal(x.shape)
            self.step({"x": x}, f"run {run}")
        return rng

    @property
    def capture(self):
        return self.session.executor.slot_capture("primary")

    def events(self, after: int = 0):
        ev = self.session.recording.capture_events()
        return ev[ev.step >= after]


def _assert_holds(runs: _Runs, warm: int = 4) -> None:
    late = runs.events(after=warm)
    assert not (late.event == "retire").any(), late[late.event == "retire"].reason.tolist()
    assert not (late.event == "capture").any(), "re-recorded after warm-up"
    assert runs.capture.replays >= RUNS - warm


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_just_in_time_seam_output_keeps_its_address_for_the_segment_reading_it(backend):
    """optimum's Range positions: a fresh array each run, read by a captured Gather +
    layers: the graph was retired every step ('binding_changed: positions address').
    The seam's result is copied into a buffer of its own; the graph holds."""
    runs = _Runs(range_positions(), backend)
    rng = np.random.default_rng(0)
    ids = np.zeros((1, 1), np.int64)
    position = np.zeros(1, np.int64)
    for run in range(RUNS):
        ids[...] = rng.integers(0, 32, (1, 1))  # the same arrays, new contents
        position[...] = 5 + run
        runs.step({"input_ids": ids, "position": position}, f"run {run}")
    _assert_holds(runs)
    assert runs.capture.kept_values, "nothing kept in place"


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_embedding_gather_sized_just_in_time_keeps_its_address(backend):
    """torch.onnx legacy's embedding Gather over input_ids reshaped by a computed shape:
    sized just in time, new each run."""
    runs = _Runs(reshaped_embedding(), backend)
    rng = np.random.default_rng(1)
    ids = np.zeros((1, 1), np.int64)
    for run in range(RUNS):
        ids[...] = rng.integers(0, 32, (1, 1))
        runs.step({"input_ids": ids}, f"run {run}")
    _assert_holds(runs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shape_that_grew_between_warm_up_steps_makes_its_readers_seams(backend):
    """torch.onnx legacy's mask: its length (a just-in-time dim, no symbol the memo
    sees) grows every step. It used to be recorded with one length and retired the next
    step; now its readers are seams with `varying_shape`, naming the value and the two
    shapes, and the layers after it replay."""
    runs = _Runs(growing_mask(), backend)
    rng = np.random.default_rng(2)
    x = np.zeros((1, 1, WIDTH), np.float32)
    past = rng.standard_normal((1, 3, WIDTH)).astype(np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        past = runs.step({"x": x, "past": past}, f"run {run}")["present"]  # grows by one each run
    _assert_holds(runs)
    declines = runs.session.recording.capture_declines()
    varying = declines[declines.reason == "varying_shape"]
    assert not varying.empty
    assert varying.detail.str.contains(r"changed shape \(1, 1, 1, \d+\) -> \(1, 1, 1, \d+\)").all(), \
        varying.detail.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plain_run_loop_with_fresh_feeds_replays(backend):
    """A plain `session.run` loop, as onnxruntime users write it, hands fresh arrays each
    step: the graphs read them, so every step retired them ('input_ids address'). Feeds
    that arrive at a new address are copied into a staging buffer each step; the
    caller's arrays are only read."""
    runs = _Runs(range_positions(), backend)
    rng = np.random.default_rng(3)
    for run in range(RUNS):
        feeds = {"input_ids": rng.integers(0, 32, (1, 1)).astype(np.int64),
                 "position": np.array([5 + run], np.int64)}
        before = {k: v.copy() for k, v in feeds.items()}
        runs.step(feeds, f"run {run}")
        for k, v in feeds.items():
            np.testing.assert_array_equal(v, before[k], err_msg=f"the caller's {k} was written")
    _assert_holds(runs)
    assert runs.session.executor.state.capture.staged_feeds


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_feed_that_moves_under_the_graphs_is_staged_from_then_on(backend):
    """A caller that holds one input array for a while, then another (a new `Generator`
    per decode, each with its staged inputs): the graphs read the first array where it
    was, so the move retired them, and after `capture_rerecord_limit` such moves the
    segment was captured no more, for good. The moved feed is staged at the next
    capture: one retire, then the graphs hold through every later move."""
    runs = _Runs(range_positions(), backend)
    rng = np.random.default_rng(4)
    position = np.zeros(1, np.int64)
    step = 0
    for holder in range(5):  # five callers in turn, each with its own array
        ids = np.zeros((1, 1), np.int64)
        for run in range(RUNS):
            ids[...] = rng.integers(0, 32, (1, 1))
            position[...] = 5 + step
            runs.step({"input_ids": ids, "position": position}, f"holder {holder} run {run}")
            step += 1
    events = runs.events()
    retires = events[events.event == "retire"]
    # (on a device backend every host feed is copied to the device, a new array each run:
    # staged from the first capture, so not even the one retire)
    assert len(retires) == (1 if backend == "cpu" else 0), retires.reason.tolist()
    assert retires.reason.str.contains("input_ids address").all(), retires.reason.tolist()
    assert not runs.capture.limited, "a moved feed must not use up the rerecord limit"
    assert runs.session.executor.state.capture.staged_feeds
    late = events[events.step >= 2 * RUNS]
    assert not late.event.isin(["capture", "retire"]).any(), late.reason.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_generator_per_decode_keeps_the_sessions_graphs(tmp_path, backend):
    """Notebook use: a `Generator` per cell over one decode session (transformers'
    prefill + decode export: the prompt runs in the other session, so the decode
    session's graphs outlive a decode). Each Generator has its own staged input
    buffers; the graphs retire once for the move and then hold, decode after decode,
    with onnxruntime's tokens. They were retired at every new Generator, and after three
    the segment reading input_ids was captured no more."""
    models.transformers_export(tmp_path)
    files = find_export(tmp_path)
    want = Generator(_ort(onnx.load(str(files.decode))), prefill=_ort(onnx.load(str(files.prefill)))).generate(
        [3, 4, 5, 6], 12, kv="growing", progress=False, eos_token_id=-1).tokens
    options = SessionOptions(trace=True)
    session = workbench.InferenceSession(str(files.decode), options, backend=backend)
    prefill = workbench.InferenceSession(str(files.prefill), options, backend=backend)
    for decode in range(5):
        got = Generator(session, prefill=prefill).generate([3, 4, 5, 6], 12, progress=False, eos_token_id=-1).tokens
        assert got == want, decode
    events = session.recording.capture_events()
    retires = events[events.event == "retire"]
    moved = retires[retires.reason.str.contains("address")]
    assert len(moved) <= 1, moved.reason.tolist()  # (each prompt re-plans the slot: those retires stay)
    assert not session.executor.slot_capture("primary").limited
    declines = session.recording.capture_declines()
    assert not (declines.reason == "rerecord_limit").any()


def feed_view() -> onnx.ModelProto:
    """torch.onnx dynamo gpt2: a layer reads a view of a feed, taken by a Reshape whose
    target is computed from a fed value (a seam: it reads the target on the host); no
    captured node reads the feed itself."""
    nodes = [helper.make_node("Concat", ["one", "width"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["view"]),
             # the layers' first node reads the view; its own shape is known
             helper.make_node("ReduceMean", ["view"], ["scale"], keepdims=0),
             helper.make_node("Mul", ["base", "scale"], ["xs"])]
    mlp, weights = _mlp_nodes("xs", "y")
    rng = np.random.default_rng(9)
    inits = [_const("one", np.array([1], np.int64)),
             _const("base", rng.standard_normal((1, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, WIDTH]),
                                helper.make_tensor_value_info("width", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], inits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fresh_feed_read_through_a_view_is_staged(backend):
    """The segment reads a zero-copy view of the feed, not the feed: the view moved with
    each fresh array ('binding_changed: view address'). The feed the chain starts from
    is staged."""
    runs = _Runs(feed_view(), backend)
    rng = np.random.default_rng(8)
    for run in range(RUNS):
        runs.step({"x": rng.standard_normal((1, 1, WIDTH)).astype(np.float32),
                   "width": np.array([WIDTH], np.int64)}, f"run {run}")
    _assert_holds(runs)
    x = runs.session.graph.by_name["x"]
    assert x in runs.session.executor.state.capture.staged_feeds


def test_stable_io_binding_inputs_are_not_staged():
    """IOBinding of arrays that stay put: nothing to copy, the graphs read them directly."""
    proto = range_positions()
    session = workbench.InferenceSession(proto.SerializeToString())
    peer = _ort(proto)
    ids, position = np.zeros((1, 1), np.int64), np.zeros(1, np.int64)
    rng = np.random.default_rng(4)
    for run in range(RUNS):
        ids[...] = rng.integers(0, 32, (1, 1))
        position[...] = 5 + run
        binding = session.io_binding()
        binding.bind_input("input_ids", ids)
        binding.bind_input("position", position)
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(binding.get_outputs()[0],
                                   peer.run(None, {"input_ids": ids, "position": position})[0],
                                   rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    cap = session.executor.slot_capture("primary")
    assert cap.replays >= RUNS - 4 and cap.staged_feeds == ()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_segment_retired_again_and_again_is_captured_no_more_and_says_why(backend):
    """A zero-copy view at a moving offset (a table row sliced at a fed position) is
    read by the layers after it: its address moves every step, which no buffer of ours
    can hold still, and the graph was retired and recorded again every other step. At
    `capture_rerecord_limit` (3) retires for that reason the segment's nodes become
    seams with `rerecord_limit`, naming the reason and the count; every value is
    onnxruntime's throughout."""
    runs = _Runs(sliding_window(), backend, capture_rerecord_limit=3)
    start = np.zeros(1, np.int64)
    for run in range(3 * RUNS):
        start[...] = (7 * run) % 60
        runs.step({"start": start}, f"run {run}")
    retires = runs.events()
    retires = retires[retires.event == "retire"]
    assert len(retires) == 3, retires.reason.tolist()  # three, then never again
    declines = runs.session.recording.capture_declines()
    limited = declines[declines.reason == "rerecord_limit"]
    assert not limited.empty
    assert limited.detail.str.contains("retired 3 times for binding_changed: row address").all(), \
        limited.detail.tolist()


def test_the_rerecord_limit_is_a_session_option():
    assert SessionOptions().capture_rerecord_limit == 3
    with pytest.raises(ValueError, match="capture_rerecord_limit"):
        SessionOptions(capture_rerecord_limit=-1)


def _decode_holds(session, prefill=None, tokens: int = 16):
    gen = Generator(session, prefill=prefill)
    result = gen.generate([3, 4, 5, 6], tokens, kv="fixed", progress=False, eos_token_id=-1)
    ev = session.recording.capture_events()
    late = ev[ev.step >= 6]
    assert not (late.event.isin(["capture", "retire"])).any(), late.reason.tolist()
    cov = reports.capture_coverage(session.recording)
    cov = cov[cov.step >= 6]
    return result.tokens, float(cov.replayed_nodes.sum() / cov.nodes.sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_gqa_in_onnxruntimes_fused_layout_holds_its_graphs(backend):
    """transformers' export after onnxruntime's CPU fusions: the mask of ones the graph
    makes from the past's length grew every step and retired the graph every third step
    ('binding_changed: attention_mask shape')."""
    model = exports.fused_gqa_without_mask(models.llama("tiny", flavor="genai"))
    want = Generator(_ort(model)).generate([3, 4, 5, 6], 16, kv="growing", progress=False, eos_token_id=-1).tokens
    session = workbench.InferenceSession(model, SessionOptions(trace=True), backend=backend)
    tokens, share = _decode_holds(session)
    assert tokens == want
    assert share > 0.3, share


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformers_prefill_and_decode_export_holds_its_graphs(tmp_path, backend):
    models.transformers_export(tmp_path)
    files = find_export(tmp_path)
    options = SessionOptions(trace=True)
    session = workbench.InferenceSession(str(files.decode), options, backend=backend)
    prefill = workbench.InferenceSession(str(files.prefill), options, backend=backend)
    cpu = Generator(workbench.InferenceSession(str(files.decode)), prefill=workbench.InferenceSession(
        str(files.prefill))).generate([3, 4, 5, 6], 16, kv="growing", progress=False, eos_token_id=-1).tokens
    tokens, share = _decode_holds(session, prefill)
    assert tokens == cpu
    assert share > 0.3, share


def unresolved_layers() -> onnx.ModelProto:
    """torch.onnx legacy / optimum: the hidden state's shape comes from a Reshape whose
    target is computed at run time, so shape inference leaves every layer after it
    unresolved and each of their outputs is sized just in time."""
    nodes = [helper.make_node("Mul", ["x", "zero_f"], ["zeros"]),  # the width, counted from values
             helper.make_node("Add", ["zeros", "one_f"], ["ones"]),
             helper.make_node("ReduceSum", ["ones", "last"], ["count_f"], keepdims=0),
             helper.make_node("ReduceMax", ["count_f"], ["width_f"], keepdims=0),
             helper.make_node("Cast", ["width_f"], ["width"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["width", "zero"], ["width1"]),
             helper.make_node("Concat", ["lead", "width1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["h0"])]
    mlp, weights = _mlp_nodes("h0", "h1")
    # between the two blocks a seam sized by those dims (ReduceMean's axes input makes
    # its output's shape an input value's), read by the second block
    norm = [helper.make_node("ReduceMean", ["h1", "last"], ["m"], keepdims=1),
            helper.make_node("Sub", ["h1", "m"], ["h1m"])]
    mlp2 = [helper.make_node(n.op_type, [{"h0": "h1m", "o": "o2", "r": "r2", "h": "h_2"}.get(i, i) for i in n.input],
                             [{"h": "h_2", "r": "r2", "o": "o2", "h1": "y"}[o] for o in n.output])
            for n in mlp]
    inits = [_const("zero", np.array([0], np.int64)), _const("lead", np.array([1, -1], np.int64)),
             _const("last", np.array([-1], np.int64)),
             _const("zero_f", np.float32(0)), _const("one_f", np.float32(1)), *weights]
    # the dims shape inference names but cannot size, shared along the layers (as an
    # exporter's `unk__N`): the first block's outputs bind them just in time
    dims = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["u1", "u2", WIDTH]) for n in ("h0", "h", "r", "o", "h1")]
    dims.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, ["u1", "u2", 1]))
    return _model(nodes + mlp + norm + mlp2,
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "width_in"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=18, value_info=dims)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layers_sized_just_in_time_are_captured_and_replay(backend):
    """A segment's nodes whose outputs no shape resolution sizes used to be seams
    ('unresolved_shape': no preallocated buffer), 60-70% of torch.onnx legacy's and
    optimum's gpt2 steps. Inside a segment an output's shape follows from the inputs'
    shapes, which every replay checks, so they are recorded with the arrays the
    recording made; a changed input shape retires the graph, and values stay
    onnxruntime's throughout. A replay binds the dims the recorded nodes revealed, as
    running them would: the seam after the first block is sized by them, and without
    them took a fresh buffer on replay steps only, which retired the second block
    every step ('binding_changed: m address'; optimum's phi3, 5% replayed)."""
    runs = _Runs(unresolved_layers(), backend)
    rng = runs.refilled((1, 1, WIDTH), 11)
    _assert_holds(runs)
    declines = runs.session.recording.capture_declines()
    assert not (declines.reason == "unresolved_shape").any(), declines.detail.tolist()
    cov = reports.capture_coverage(runs.session.recording)
    late = cov[cov.step >= 4]
    assert (late.replayed_nodes >= 16).all(), late.replayed_nodes.tolist()
    # another shape: the recorded arrays are the wrong size; the check sees the input move
    wide = np.zeros((1, 3, WIDTH), np.float32)
    for run in range(RUNS):
        wide[...] = rng.standard_normal(wide.shape)
        assert runs.step({"x": wide}, f"wide run {run}")["y"].shape == (1, 3, WIDTH)
    ev = runs.events(after=RUNS)
    assert (ev.event == "retire").any(), "the first wide run must retire the narrow graph"


def untyped_norm() -> onnx.ModelProto:
    """onnxruntime's CPU fusions on transformers' gpt2: SkipLayerNormalization's mean and
    inv_std outputs, and what reads them, come out of ONNX shape inference untyped."""
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("SkipLayerNormalization", ["h", "x", "gamma", "beta"], ["n", "mean", "inv_std", "sum"],
                              domain="com.microsoft", epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w2"], ["y0"]),
             helper.make_node("Mul", ["inv_std", "mean"], ["t"]),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1),
             helper.make_node("Add", ["y0", "p"], ["y"])]
    inits = [_const("w1", rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)),
             _const("w2", rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)),
             _const("gamma", np.ones(WIDTH, np.float32)), _const("beta", np.zeros(WIDTH, np.float32))]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, WIDTH])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, WIDTH])], inits)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_shape_inference_left_untyped_are_captured_once_seen_as_tensors(backend):
    """A value ONNX shape inference left untyped (kind 'unknown') made every node writing
    it a seam ('sequence_value: output val_240 is a unknown'): transformers' gpt2 after
    onnxruntime's CPU fusions replayed 18% of its step. Once a warm step saw a tensor
    there it is captured like any other; the values stay onnxruntime's."""
    runs = _Runs(untyped_norm(), backend)
    graph = runs.session.graph
    for name in ("mean", "inv_std", "t", "p"):  # as onnx left them in that export
        value = graph.values[graph.by_name[name]]
        value.kind, value.shape, value.dtype = "unknown", None, None
    runs.refilled((1, 1, WIDTH), 13)
    _assert_holds(runs)
    declines = runs.session.recording.capture_declines()
    assert not (declines.reason == "sequence_value").any(), declines.detail.tolist()
    late = reports.capture_coverage(runs.session.recording)
    assert (late[late.step >= 4].replayed_nodes == 6).all()


def _unresolved_hidden(x: str, out: str) -> tuple[list, list]:
    """x reshaped by a target counted from its values: every shape after it is sized
    just in time (torch.onnx legacy's and optimum's `unk__N`), as `unresolved_layers`."""
    nodes = [helper.make_node("Mul", [x, "zero_f"], ["zeros"]),
             helper.make_node("Add", ["zeros", "one_f"], ["ones"]),
             helper.make_node("ReduceSum", ["ones", "last"], ["count_f"], keepdims=0),
             helper.make_node("ReduceMax", ["count_f"], ["width_f"], keepdims=0),
             helper.make_node("Cast", ["width_f"], ["width"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["width", "zero"], ["width1"]),
             helper.make_node("Concat", ["lead", "width1"], ["target"], axis=0),
             helper.make_node("Reshape", [x, "target"], [out])]
    inits = [_const("zero", np.array([0], np.int64)), _const("lead", np.array([1, -1], np.int64)),
             _const("last", np.array([-1], np.int64)), _const("zero_f", np.float32(0)),
             _const("one_f", np.float32(1))]
    return nodes, inits


def legacy_heads() -> onnx.ModelProto:
    """torch.onnx legacy attention's shape arithmetic: the hidden state's own Shape ->
    Gather -> Unsqueeze -> Concat gives the targets of the Reshapes that split it into
    heads and merge them back, a Range of its length gives positions and a
    ConstantOfShape of its shape a zero bias: every one reads values on the host, and
    each value is a function of shapes alone."""
    head, heads = WIDTH // 2, 2
    prologue, inits = _unresolved_hidden("x", "h0")
    nodes = prologue + [
        helper.make_node("Shape", ["h0"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
        helper.make_node("Unsqueeze", ["t", "zero"], ["t1"]),
        helper.make_node("Concat", ["b1", "t1", "heads", "head"], ["split"], axis=0),
        helper.make_node("Reshape", ["h0", "split"], ["h4"]),
        helper.make_node("Transpose", ["h4"], ["ht"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["ht", "ht"], ["hh"]),
        helper.make_node("Transpose", ["hh"], ["hb"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["b1", "t1", "width_c"], ["merge"], axis=0),
        helper.make_node("Reshape", ["hb", "merge"], ["h5"]),
        helper.make_node("Range", ["i0", "t", "i1"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "zero"], ["pos_row"]),
        helper.make_node("Unsqueeze", ["pos_row", "last"], ["pos3"]),
        helper.make_node("ConstantOfShape", ["merge"], ["bias0"],
                         value=numpy_helper.from_array(np.full(1, 0.25, np.float32))),
        helper.make_node("Add", ["h5", "pos3"], ["h6"]),
        helper.make_node("Add", ["h6", "bias0"], ["h7"])]
    mlp, weights = _mlp_nodes("h7", "y")
    inits += [_const("i0", np.int64(0)), _const("i1", np.int64(1)), _const("heads", np.array([heads], np.int64)),
              _const("head", np.array([head], np.int64)), _const("width_c", np.array([WIDTH], np.int64)),
              *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "width_in"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=18)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_arithmetic_computed_inside_the_segments_is_baked_and_its_readers_captured(backend):
    """torch.onnx legacy's and optimum's Reshape / Slice / Expand / Range readers of
    Shape -> Gather -> Concat arithmetic were seams ('host_read'), since their shapes
    are `unk__N` dims no static resolution folds: 20-25% of SmolLM2's step in those
    exports stayed eager. Where every node computing such a value is captured, the
    value follows from the input shapes each replay checks, so the recording takes it
    as a constant ('bake' event) and the readers are captured; values stay
    onnxruntime's, and another input shape retires the graph."""
    runs = _Runs(legacy_heads(), backend)
    rng = runs.refilled((1, 1, WIDTH), 21)
    _assert_holds(runs)
    declines = runs.session.recording.capture_declines()
    baked_readers = declines[declines.reason.isin(["host_read", "data_dependent_shape"])]
    # only the prologue's Reshape (its target counted from values) still reads on the host
    assert len(set(baked_readers.plan_index)) == 1, baked_readers[["node", "op_type", "reason"]].to_string()
    bakes = runs.events()
    bakes = bakes[bakes.event == "bake"]
    assert bakes.reason.str.contains("shape arithmetic computed inside the captured segments").sum() >= 4, \
        bakes.reason.tolist()
    wide = np.zeros((1, 3, WIDTH), np.float32)
    for run in range(RUNS):
        wide[...] = rng.standard_normal(wide.shape)
        assert runs.step({"x": wide}, f"wide run {run}")["y"].shape == (1, 3, WIDTH)
    ev = runs.events(after=RUNS)
    assert (ev.event == "retire").any(), "the first wide run must retire the narrow graph"
    assert runs.capture.replays >= 2 * RUNS - 8


def sliced_by_a_fed_length() -> onnx.ModelProto:
    """A Slice to a fed length (a seam: it reads the length on the host) whose result's
    Shape arithmetic reshapes it inside the segment after it: the segment's input shape
    moves with a value, no symbol."""
    nodes = [helper.make_node("Slice", ["x", "zero", "length", "one"], ["hs"]),
             helper.make_node("Shape", ["hs"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n1"], axis=0),
             helper.make_node("Concat", ["n1", "one"], ["target"], axis=0),
             helper.make_node("Reshape", ["hs", "target"], ["column"]),
             helper.make_node("MatMul", ["column", "w0"], ["rows"]),
             helper.make_node("ReduceMean", ["rows", "zero"], ["mean"], keepdims=1)]
    mlp, weights = _mlp_nodes("mean", "y")
    rng = np.random.default_rng(22)
    inits = [_const("zero", np.array([0], np.int64)), _const("one", np.array([1], np.int64)),
             _const("w0", rng.standard_normal((1, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                                helper.make_tensor_value_info("length", TensorProto.INT64, [1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], inits, opset=18)


@pytest.mark.parametrize("backend", BACKENDS)
def test_baked_shape_arithmetic_is_never_stale(backend):
    """A recording on CUDA computes nothing: it bakes the warm-up step's host copies of
    shape arithmetic. When a segment's input has another shape at the capture step than
    at the warm-up (here a length fed as a value, no symbol), those copies would be
    stale: the step runs eagerly with 'stale_bake' naming the value and both shapes, and
    the next capture treats the moving shape as a seam. On the CPU the recording runs
    the arithmetic itself. Every value is onnxruntime's."""
    runs = _Runs(sliced_by_a_fed_length(), backend)
    rng = np.random.default_rng(23)
    x = np.zeros((1, 16), np.float32)
    length = np.zeros(1, np.int64)
    for run, n in enumerate([3, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7]):
        x[...] = rng.standard_normal(x.shape)
        length[...] = n
        runs.step({"x": x, "length": length}, f"run {run} (length {n})")
    events = runs.events()
    stale = events[events.reason.str.startswith("stale_bake")]
    if backend == "cuda":
        assert not stale.empty, events[["step", "event", "reason"]].to_string()
        assert stale.reason.str.contains(r"'hs' has shape \(1, 5\), the warm-up step's was \(1, 3\)").any(), \
            stale.reason.tolist()
    else:
        assert stale.empty
    assert runs.capture.replays >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimum_merged_decoders_branch_is_captured_and_says_what_it_replayed(backend):
    """optimum's merged decoder is one If on use_cache_branch whose branches are whole
    models: the If is a seam, so nothing was captured (0% replayed on every merged
    export). The branch runs as a graph of its own with its own captured segments; each
    step's `branch_capture` row says what it replayed, and `capture_coverage` counts the
    branch's nodes in place of the If. Tokens are onnxruntime's; the graphs hold."""
    model = models.llama("tiny", export="optimum-merged")
    want = Generator(_ort(model)).generate([3, 4, 5, 6], 16, kv="growing", progress=False, eos_token_id=-1).tokens
    session = workbench.InferenceSession(model, SessionOptions(trace=True), backend=backend)
    tokens, share = _decode_holds(session)
    assert tokens == want
    rows = session.recording.table("branch_capture")
    late = rows[rows.step >= 6]
    assert (late.replayed_nodes > 0).all() and (late.replayed_us > 0).all(), late.to_string()
    assert late.captures.nunique() == 1 and late.retires.nunique() == 1, "re-recorded after warm-up"
    assert late.seams.str.contains("growing_symbol").all()  # what stays eager, by reason
    assert share > 0.35, share
    # the branch's eager kernels are timed on the host clock, so coverage counts the
    # branch's node time in place of the If's (on a device: not timed, the If's time)
    if backend == "cpu":
        assert (late.eager_us > 0).all(), late.eager_us.tolist()
        cov = reports.capture_coverage(session.recording)
        t = session.recording.node_timings()
        for step in late.step:
            if_us = t[(t.step == step) & t.plan_index.isin(late.plan_index)].duration_us.sum()
            row = late[late.step == step].iloc[0]
            assert row.replayed_us + row.eager_us <= if_us
            got = cov[cov.step == step].iloc[0]
            assert got.replayed_us == pytest.approx(row.replayed_us)
            assert got.time_us == pytest.approx(t[t.step == step].duration_us.sum() - if_us
                                                + row.replayed_us + row.eager_us)
    else:
        assert late.eager_us.isna().all()


def overwritten_shape_value() -> onnx.ModelProto:
    """Shape arithmetic whose buffer a later node overwrites in place: x's length (a
    Gather of its Shape) sizes a Range, then an Add writes its own result into the
    Gather's bytes (compute_in_place: the length is dead after it)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["length"], axis=0),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Add", ["length", "five"], ["shifted"]),
             helper.make_node("Cast", ["shifted"], ["shift_f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["positions"], ["pos_f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["pos_f", "axis1"], ["column"]),
             helper.make_node("Mul", ["column", "x"], ["rows"]),
             helper.make_node("MatMul", ["rows", "w0"], ["hidden"]),
             helper.make_node("Mul", ["hidden", "shift_f"], ["scaled"])]
    mlp, weights = _mlp_nodes("scaled", "y")
    rng = np.random.default_rng(24)
    inits = [_const("one", np.int64(1)), _const("zero", np.int64(0)), _const("five", np.int64(5)),
             _const("axis1", np.array([1], np.int64)),
             _const("w0", rng.standard_normal((4, WIDTH)).astype(np.float32)), *weights]
    return _model(nodes + mlp, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, WIDTH])], inits, opset=18)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_arithmetic_overwritten_in_place_is_not_baked_from_the_warm_up(backend):
    """On CUDA a recording bakes host copies taken after the warm-up step; a value whose
    bytes a later node overwrote in place (here [4] -> [9]) holds the writer's value by
    then, and baking it would size the Reshape wrongly (optimum's llama on the device
    double: 'stale_bake: /model/Gather_1_output_0', 7 where the value is 1). Such values
    are not baked there; every run is onnxruntime's on both backends."""
    runs = _Runs(overwritten_shape_value(), backend)
    storage = runs.session.executor.state.storage
    length = runs.session.graph.by_name["length"]
    runs.refilled((1, 4), 25)
    storage = runs.session.executor.state.storage
    assert storage.storage.get(runs.session.graph.by_name["shifted"]) == "alias", "the Add no longer writes in place"
    assert storage.owner[runs.session.graph.by_name["shifted"]] == length
    _assert_holds(runs)
    events = runs.events()
    assert not events.reason.str.startswith("stale_bake").any(), events.reason.tolist()


def test_shape_arithmetic_fixed_by_the_input_shapes_is_not_relaunched():
    """A CPU recording runs its nodes; the Shape -> Gather -> Concat arithmetic wholly
    inside the captured segments gives the same values at every replay that passes the
    input-shape checks, so the launch list leaves it out and the arrays keep the
    recording's values (a capture event says how many nodes). Values stay onnxruntime's
    over runs refilling x in place, and a wider x retires the graph and is right too."""
    runs = _Runs(legacy_heads(), "cpu")
    rng = runs.refilled((1, 1, WIDTH), 26)
    _assert_holds(runs)
    cap = runs.capture
    constant = cap.constant
    plan = runs.session.executor.plan
    ops = {plan.nodes[k].node.op_type for k in constant}
    assert {"Shape", "Concat"} <= ops, ops
    assert not {"MatMul", "Reshape"} & ops, ops
    assert _launch_count(cap) > 0 and not constant & _recorded_nodes(cap), "constant nodes still launched"
    captures = runs.events()
    captures = captures[captures.event == "capture"]
    assert captures.reason.str.contains("not launched again").any(), captures.reason.tolist()
    wide = np.zeros((1, 3, WIDTH), np.float32)
    for run in range(RUNS):
        wide[...] = rng.standard_normal(wide.shape)
        assert runs.step({"x": wide}, f"wide run {run}")["y"].shape == (1, 3, WIDTH)
    assert (runs.events(after=RUNS).event == "retire").any()


def offset_over_shape_value() -> onnx.ModelProto:
    """`overwritten_shape_value` with the in-place Add reading a fed offset: the writer
    over the length's bytes is not shape arithmetic, so it runs at every replay."""
    proto = overwritten_shape_value()
    graph = proto.graph
    for node in graph.node:
        if list(node.output) == ["shifted"]:
            node.input[1] = "offset"
    graph.input.append(helper.make_tensor_value_info("offset", TensorProto.INT64, []))
    kept = [init for init in graph.initializer if init.name != "five"]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return proto


def test_shape_arithmetic_overwritten_in_place_is_launched_at_every_replay():
    """The length a Range reads is overwritten in place by a later Add of a fed offset
    (compute in place), which every replay runs: left out of the launch list, the
    length's bytes would hold the last Add's sum at the next replay, and the sums would
    pile up. It stays launched, and every run is onnxruntime's."""
    runs = _Runs(offset_over_shape_value(), "cpu")
    graph = runs.session.graph
    rng = np.random.default_rng(27)
    x = np.zeros((1, 4), np.float32)
    offset = np.zeros((), np.int64)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        offset[...] = run % 3
        runs.step({"x": x, "offset": offset}, f"run {run}")
    _assert_holds(runs)
    ex = runs.session.executor
    assert ex.state.storage.storage.get(graph.by_name["shifted"]) == "alias"
    assert ex.state.storage.owner[graph.by_name["shifted"]] == graph.by_name["length"]
    gather = next(p.index for p in ex.plan.nodes if graph.by_name["length"] in p.outputs)
    assert gather not in runs.capture.constant
    assert gather in _recorded_nodes(runs.capture)


def _launch_count(cap) -> int:
    return sum(len(captured.graph.launches) for captured in cap.graphs.values())


def _recorded_nodes(cap) -> set[int]:
    return {k for captured in cap.graphs.values() for k in captured.launched_nodes}


def view_reshaped_each_step() -> onnx.ModelProto:
    """torch.onnx legacy's attention Reshape: its target shape is a fed value (read on
    the host, so the Reshape is a seam) and it makes a new view object of the same
    buffer every run, which a captured segment with weights reads."""
    rng = np.random.default_rng(11)
    w_in = _const("w_in", rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
    w_out = _const("w_out", rng.standard_normal((WIDTH // 2, WIDTH)).astype(np.float32))
    bias = _const("bias", rng.standard_normal(WIDTH).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["halves"]),
             helper.make_node("MatMul", ["halves", "w_out"], ["o"]), helper.make_node("Add", ["o", "bias"], ["p"]),
             helper.make_node("Tanh", ["p"], ["y"])]
    return _model(nodes,
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH]),
                   helper.make_tensor_value_info("target", TensorProto.INT64, ["rank"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w_in, w_out, bias])


def test_a_segment_reading_a_new_view_each_run_rereads_only_that_input(monkeypatch):
    """The captured segment after the Reshape reads a new view object each run (same
    address, shape and strides) and two weights. Its replay check took the full path
    every run: every input's shape, strides, dtype and address read again, weights
    included (torch.onnx legacy's gpt2: 110 inputs a step, 19% of its plain-loop step).
    The weights are the executor's own arrays, checked by identity; now only the new
    view's address is read. Over runs refilling x in place the graphs hold and every
    output is onnxruntime's; a target that changes the view's shape retires the graph,
    and the runs after it are right too."""
    from workbench.addresses import address
    from workbench.executor import capture as capture_module

    runs = _Runs(view_reshaped_each_step(), "cpu")
    rng = np.random.default_rng(12)
    x = np.zeros((1, WIDTH), np.float32)
    target = np.array([2, WIDTH // 2], np.int64)
    read = []
    monkeypatch.setattr(capture_module, "address", lambda a: read.append(a) or address(a))
    weights = {id(a) for a in runs.session.executor.graph.initializers.values()}
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        read.clear()
        runs.step({"x": x, "target": target}, f"run {run}")
        if run >= 4:  # steady: one address read, the new view's, and no weight's
            assert len(read) == 1 and read[0].shape == (2, WIDTH // 2) and read[0].base is not None, \
                [getattr(a, "shape", a) for a in read]
            assert id(read[0]) not in weights
    _assert_holds(runs)
    target = np.array([1, 2, WIDTH // 2], np.int64)  # the view's shape changes under the graph
    for run in range(4):
        x[...] = rng.standard_normal(x.shape)
        assert runs.step({"x": x, "target": target}, f"3-d run {run}")["y"].shape == (1, 2, WIDTH)
    late = runs.events(after=RUNS)
    assert (late.event == "retire").any() and (late.event == "replay").any(), late.reason.tolist()


def test_a_replay_check_whose_live_input_is_a_new_object_reads_it_in_full():
    """`CapturedGraph.mismatch` once a check passed: a live input that is another object
    than last time is read in full (address, shape, strides, dtype) against the
    recording, and the weights by identity. A new view at the same place replays; one
    at another offset, of another shape or dtype, or a weight swapped for another
    array, does not, and says what moved."""
    from types import SimpleNamespace

    from workbench.executor.capture import CapturedGraph, binding_signature

    buffer = np.arange(32, dtype=np.float32)
    weight = np.ones((4, 4), np.float32)
    arrays = [buffer, buffer[:16].reshape(4, 4), weight]
    graph = SimpleNamespace(values=[SimpleNamespace(name=n) for n in ("buffer", "view", "weight")],
                            initializers={2: weight})
    captured = CapturedGraph(graph=None, signature=binding_signature(arrays, [1, 2]), outputs={})

    def why(view, w=weight):
        arrays[1], arrays[2] = view, w
        return captured.mismatch(arrays, [], graph, {}, set())

    assert why(arrays[1]) is None and why(arrays[1]) is None  # the same objects: by identity
    assert why(buffer[:16].reshape(4, 4)) is None  # a new view where the last one was
    assert why(buffer[16:].reshape(4, 4)) == ("binding_changed", "view address")
    assert why(buffer[:16].reshape(2, 8))[1] == "view shape (4, 4) -> (2, 8)"
    assert why(buffer[:16].reshape(4, 4)) is None  # back where it was recorded
    assert why(buffer[:16].view(np.int32).reshape(4, 4)) == ("binding_changed", "view dtype")
    assert why(buffer[:16].reshape(4, 4), weight.copy()) == ("binding_changed", "weight address")
    assert why(buffer[:16].reshape(4, 4)) is None

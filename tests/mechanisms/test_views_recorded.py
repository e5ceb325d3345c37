"""What a real decode step records: zero-copy views, materialisations, liveness, memory."""

from __future__ import annotations

import numpy as np
import pytest

import workbench
from workbench import Generator, Recording, SessionOptions, models

PROMPT = list(range(3, 13))


def _decode(model, options=None, tokens=4):
    session = workbench.InferenceSession(model, options=options)
    result = Generator(session).generate(PROMPT, tokens, progress=False, eos_token_id=-1)
    return session, result


@pytest.mark.parametrize("flavor", ["onnx", "genai"])
def test_layout_ops_copy_nothing_but_the_listed_materialisations(flavor):
    session, _ = _decode(models.llama("tiny", flavor=flavor))
    rec = session.recording
    step = rec.steps().query("phase == 'decode'").step.iloc[-1]
    layout = set(rec.nodes().query("produces_view").plan_index)
    timings = rec.node_timings()
    executed = set(timings[timings.step == step].plan_index) & layout
    if flavor == "onnx":
        assert executed, "the standard-ops llama has layout ops"
    # (the genai flavour fuses them away: then nothing may be copied at all)
    views = rec.views()[lambda f: f.step == step]
    copies = rec.materializations()[lambda f: f.step == step]
    live = rec.liveness()[lambda f: f.step == step].set_index("value")
    nodes = rec.nodes().set_index("plan_index")
    for plan_index in executed:
        for out in nodes.loc[plan_index, "outputs"]:
            row = live.loc[out]
            if out in set(views.value):
                # a view owns no bytes and points at a buffer owner
                assert row.storage == "view" and row.bytes == 0
                assert live.loc[views.set_index("value").loc[out, "source"], "storage"] in (
                    "owner", "input", "initializer", "alias")
            else:
                # not a view: then it must be listed as a materialisation, with its bytes
                listed = copies[copies.value == out]
                assert len(listed) == 1, f"{out} was copied without being recorded"
                assert listed.bytes.iloc[0] == row.bytes > 0
    # and the arrays themselves agree: a view value shares memory with its source
    arrays = session.executor.arrays
    for _, v in views.iterrows():
        assert np.shares_memory(arrays[v.value_id], arrays[v.source_id])


def test_views_pin_their_source_and_strides_walk_it():
    session, _ = _decode(models.llama("tiny", flavor="onnx"), tokens=2)
    rec = session.recording
    views = rec.views()
    pins = rec.buffer_events().query("event == 'pin'")
    for step, group in views.groupby("step"):
        assert set(group.source_id) <= set(pins[pins.step == step].value_id)
    live = rec.liveness()
    pinned_owners = set(live[live.pinned].owner_id)
    assert set(views.source_id) <= pinned_owners
    transposes = views[views.op == "Transpose"]
    assert len(transposes) and any(list(s) != sorted(s, reverse=True) for s in transposes.strides)


def test_slice_with_negative_step_is_a_view_with_negative_strides():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in
             (("starts", -1), ("ends", -7), ("axes", 1), ("steps", -2))]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Neg", ["s"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "neg", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    session = workbench.InferenceSession(model)
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(session.run(None, {"x": data})[0], -data[:, ::-2])
    view = session.recording.views().iloc[0]
    assert view.strides == (6, -2) and view.byte_offset == 5 * 4 and view.source == "r"


def test_tracing_off_records_nothing():
    session, _ = _decode(models.gpt2("tiny"), SessionOptions(trace=False))
    assert session.recording is None and session.executor.recording is None


def test_saved_recording_explores_without_the_model(tmp_path):
    session, result = _decode(models.gpt2("tiny"))
    session.recording.save(tmp_path / "rec")
    loaded = Recording.load(tmp_path / "rec")
    assert len(loaded) == len(result.tokens)
    assert loaded.table("tokens").token.tolist() == result.tokens
    for frame in ("views", "liveness", "buffer_events", "node_timings", "steps", "memory_summary"):
        a, b = getattr(session.recording, frame)(), getattr(loaded, frame)()
        assert list(a.columns) == list(b.columns) and len(a) == len(b), frame


def test_memory_summary_orders_the_three_numbers():
    session, _ = _decode(models.llama("tiny", flavor="onnx"), tokens=2)
    summary = session.recording.memory_summary()
    assert (summary.lower_bound_bytes <= summary.planner_peak_bytes).all()
    assert (summary.planner_peak_bytes <= summary.one_buffer_per_value_bytes).all()


def test_release_dead_values_lowers_the_resident_peak():
    model = models.llama("tiny", flavor="onnx")
    keep, _ = _decode(model, tokens=1)
    free, _ = _decode(model, SessionOptions(release_dead_values=True), tokens=1)
    kept = keep.recording.steps().resident_peak_bytes.iloc[0]
    freed = free.recording.steps().resident_peak_bytes.iloc[0]
    assert freed < kept
    released = free.recording.buffer_events().query("event == 'release'")
    assert len(released) > 0


@pytest.mark.parametrize("capture", [False, True])
def test_a_view_that_must_copy_owns_its_bytes_each_step_vs_onnxruntime(capture):
    """Reshape of a transposed view cannot alias: its output owns a copy, the
    Transpose's stays a view pinning its source. The executor shares the storage plan's
    owners until a layout node changes one (then copies them for that step). Every
    step, eager or replayed, records so (liveness, the view row, the pin), the plan's
    own owners are never changed, and each of 8 runs (one input buffer, new contents)
    agrees with onnxruntime."""
    from onnx import helper
    from oracles import ort_session, runs_on_one_buffer, tensor

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["flat"]),
             helper.make_node("Neg", ["flat"], ["y"])]
    graph = helper.make_graph(nodes, "copying_view", [tensor("x", [2, 3, 4])], [tensor("y", [2, 12])],
                              [helper.make_tensor("shape", 7, [2], [2, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = workbench.InferenceSession(model, SessionOptions(capture=capture))
    planned = None
    values = {v.name: v.id for v in session.graph.values}
    for run, _, got, want in runs_on_one_buffer(session, ort_session(model), (2, 3, 4), 8,
                                                np.random.default_rng(5)):
        np.testing.assert_array_equal(got, want, err_msg=f"run {run}")
        storage = session.executor.state.storage
        planned = planned or dict(storage.owner)
        assert storage.owner == planned, "a step changed the storage plan's owners"
    rec = session.recording
    live = rec.liveness().set_index(["step", "value"])
    views = rec.views()
    pins = rec.buffer_events().query("event == 'pin'")
    for step in rec.steps().step:
        assert live.loc[(step, "t"), "storage"] == "view" and live.loc[(step, "r"), "pinned"]
        assert live.loc[(step, "flat"), "storage"] == "owner" and live.loc[(step, "flat"), "bytes"] == 96
        assert list(views[views.step == step].value) == ["t"], f"step {step}"
        assert list(pins[pins.step == step].value_id) == [values["r"]], f"step {step}"
    if capture:
        assert (rec.node_timings()["mode"] == "replayed").any(), "no step replayed a captured segment"
    assert planned[values["flat"]] != values["flat"], "the plan expected a view: nothing was copied"


def test_views_with_the_same_byte_strides_and_other_item_sizes_keep_their_own_strides():
    """A view's strides are recorded in elements, worked out once per (byte strides,
    item size) and kept (`views.element_strides`): a float32 slice taking every second
    element and a float64 slice taking every element both step 8 bytes, and must read
    (2,) and (1,). Eight runs refilling both inputs in place, against onnxruntime; every
    step records both views with their own strides."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from workbench.executor import views

    inits = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in
             (("zero", 0), ("one", 1), ("end", 8), ("two", 2))]
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Relu", ["b"], ["rb"]),
             helper.make_node("Slice", ["ra", "zero", "end", "zero", "two"], ["sa"]),
             helper.make_node("Slice", ["rb", "one", "end", "zero", "one"], ["sb"]),
             helper.make_node("Neg", ["sa"], ["ya"]), helper.make_node("Neg", ["sb"], ["yb"])]
    model = helper.make_model(helper.make_graph(
        nodes, "strides", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8]),
                           helper.make_tensor_value_info("b", TensorProto.DOUBLE, [8])],
        [helper.make_tensor_value_info(y, t, None) for y, t in (("ya", TensorProto.FLOAT), ("yb", TensorProto.DOUBLE))],
        inits), opset_imports=[helper.make_opsetid("", 17)])
    views.ELEMENT_STRIDES.clear()
    session = workbench.InferenceSession(model)
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    a, b = np.zeros(8, np.float32), np.zeros(8, np.float64)
    for _ in range(8):
        a[...], b[...] = rng.standard_normal(8), rng.standard_normal(8)
        for got, want in zip(session.run(None, {"a": a, "b": b}), peer.run(None, {"a": a, "b": b})):
            np.testing.assert_array_equal(got, want)
    rows = session.recording.views()
    assert len(rows) == 16
    for step, group in rows.groupby("step"):
        assert dict(zip(group.value, group.strides)) == {"sa": (2,), "sb": (1,)}, step
    assert views.element_strides(np.zeros(3, np.dtype("V0"))) == (0,)  # a zero-size item: strides in bytes
    views.ELEMENT_STRIDES.update({((i,), 4): (i,) for i in range(views.ELEMENT_STRIDES_KEPT)})
    assert views.element_strides(np.zeros((2, 3), np.int16)[:, ::2]) == (3, 2)
    assert len(views.ELEMENT_STRIDES) == 1  # full: the spent geometries are let go

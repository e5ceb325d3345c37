"""A lean trace (`SessionOptions(trace_memory=False)`): the steps, node timings, the memo
and the capture tables without the memory tables (liveness, io_buffers, views, buffer
events, aliases, materializations); the same values and tokens as a full trace and as
onnxruntime, and every report says "not recorded" where the memory tables would be."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pandas as pd
from builtin_models import BUILT_IN, PROMPT
from onnx import TensorProto, helper
from oracles import ort_session, runs_on_one_buffer, tensor

import workbench
from workbench import Generator, Recording, SessionOptions, reports
from workbench.reports import MEMORY_NOT_RECORDED, Frames
from workbench.widgets.model.diagnostics import DiagnosticsModel

LEAN = SessionOptions(trace_memory=False)


def _views_and_in_place() -> onnx.ModelProto:
    """Layout views (Reshape, Transpose), an elementwise op that may write in place and
    a MatMul: every kind of memory row a step can emit."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Relu", ["t"], ["a"]),
        helper.make_node("Add", ["a", "a"], ["b"]),
        helper.make_node("MatMul", ["b", "w"], ["y"]),
    ]
    inits = [helper.make_tensor("shape", TensorProto.INT64, [2], [4, 6]),
             helper.make_tensor("w", TensorProto.FLOAT, [4, 3], w.reshape(-1).tolist())]
    graph = helper.make_graph(nodes, "views", [tensor("x", [2, 12])], [tensor("y", [6, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_lean_trace_computes_what_onnxruntime_does_on_one_buffer_with_new_contents():
    model = _views_and_in_place()
    lean = workbench.InferenceSession(model, options=LEAN)
    full = workbench.InferenceSession(model)
    oracle = ort_session(model)
    rng = np.random.default_rng(7)
    x = np.empty((2, 12), np.float32)
    for run in range(8):  # one array at one address, new contents each run
        x[...] = rng.standard_normal(x.shape)
        want = oracle.run(None, {"x": x.copy()})[0]
        np.testing.assert_array_equal(lean.run(None, {"x": x})[0], want, err_msg=f"run {run}")
        np.testing.assert_array_equal(full.run(None, {"x": x})[0], want, err_msg=f"run {run}")
    for run, _name, got, want in runs_on_one_buffer(lean, oracle, (2, 12), 6, rng):
        np.testing.assert_array_equal(got, want, err_msg=f"run {run}")
    rec, whole = lean.recording, full.recording
    assert rec.memory is False and whole.memory is True
    for frame in ("liveness_frame", "views", "buffer_events", "aliases", "materializations"):
        assert getattr(rec, frame)().empty, frame
    for frame in ("liveness_frame", "views", "buffer_events"):  # (aliases: replayed after warm-up)
        assert not getattr(whole, frame)().empty, frame
    assert "io_buffers" not in rec.tables and "io_buffers" in whole.tables
    # the steps and every node's timing row are kept
    assert len(rec.steps()) == 14 and len(whole.steps()) == 8
    assert len(rec.node_timings()) == 14 * len(lean.plan.nodes)


def test_a_lean_decode_keeps_the_memo_and_capture_tables_and_decodes_token_exact():
    data = BUILT_IN["llama-genai"]().SerializeToString()
    lean = workbench.InferenceSession(data, options=LEAN)
    full = workbench.InferenceSession(data)
    want = Generator(ort_session(onnx.load_from_string(data))).generate(
        PROMPT, 10, progress=False, eos_token_id=-1, kv="fixed")
    got = Generator(lean).generate(PROMPT, 10, progress=False, eos_token_id=-1, kv="fixed")
    got_full = Generator(full).generate(PROMPT, 10, progress=False, eos_token_id=-1, kv="fixed")
    assert got.tokens == got_full.tokens == want.tokens
    rec = lean.recording
    for table in ("memo", "capture_segments", "capture_events", "tokens", "rewrites"):
        assert table in rec.tables, table
    # the lean recording's timing rows are the full one's, row for row (step, node, mode)
    ours, theirs = rec.node_timings(), full.recording.node_timings()
    assert list(zip(ours.step, ours.plan_index, ours["mode"])) == \
        list(zip(theirs.step, theirs.plan_index, theirs["mode"]))
    assert list(rec.memo_timeline().action) == list(full.recording.memo_timeline().action)
    assert rec.liveness_frame().empty and "io_buffers" not in rec.tables


def test_the_flag_survives_save_and_load_and_older_saves_read_as_full(tmp_path):
    session = workbench.InferenceSession(_views_and_in_place(), options=LEAN)
    session.run(None, {"x": np.ones((2, 12), np.float32)})
    session.recording.save(tmp_path / "lean")
    loaded = Recording.load(tmp_path / "lean")
    assert loaded.memory is False and len(loaded.node_timings()) == len(session.plan.nodes)
    assert loaded.liveness_frame().empty
    # a save from before the flag existed has no "memory" key: it had every table
    meta_path = tmp_path / "lean" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["memory"]
    meta_path.write_text(json.dumps(meta))
    assert Recording.load(tmp_path / "lean").memory is True
    assert Recording().memory is True
    direct = Recording(memory=False)  # a caller emitting rows itself: the memory ones are not kept
    direct.begin_step()
    direct.liveness([(0, "owner", 0, 16, -1, 1, False, -1)])
    direct.view(1, 0, (4,), (1,), 0, 0)
    direct.buffer("alloc", 0, 16, 0)
    direct.end_step(1e-3)
    assert direct.liveness().empty and direct.views().empty and direct.buffer_events().empty
    assert len(direct.steps()) == 1


def test_reports_say_the_memory_tables_were_not_recorded_rather_than_none_happened():
    session = workbench.InferenceSession(BUILT_IN["llama-genai"]().SerializeToString(), options=LEAN)
    Generator(session).generate(PROMPT, 6, progress=False, eos_token_id=-1, kv="fixed")
    f = Frames(session.recording)
    assert f.memory is False
    s = reports.summary(f).set_index("metric")
    for metric in ("zero-copy views, in-place writes, copies", "planner peak, lower bound, one buffer per value",
                   "alias hazards"):
        assert s.loc[metric, "text"] == MEMORY_NOT_RECORDED and pd.isna(s.loc[metric, "value"])
    assert "zero-copy views created" not in s.index  # no zero passed off as a count
    html = reports.render_html(f)
    assert html.count("trace_memory=False") >= 4  # views, liveness, hazards, peak
    assert "No views were created at this step" not in html and "No write into a buffer" not in html
    model = DiagnosticsModel(f)
    for call in ("peak values", "resident", "alias hazards"):
        frame, headline = model.frame(call, 3)
        assert frame.empty and MEMORY_NOT_RECORDED in headline, call
    _, headline = model.frame("KV growth", 3)
    assert MEMORY_NOT_RECORDED in headline
    kv = reports.kv_growth(f)
    present = kv[kv.io == "present"]
    assert len(present) and present.how.isna().all() and present.copied_bytes.isna().all()
    assert present.moved.isna().all() and kv.bytes.isna().all()  # not "bound", not 0 copied
    diff = reports.diff_steps(f, 1, 4)
    views = diff[diff.aspect == "views"]
    assert len(views) == 3 and views.a.isna().all() and views.b.isna().all()  # unknown, not 0
    assert not views.changed.any()
    # a full recording's summary still counts them
    full = workbench.InferenceSession(BUILT_IN["llama-genai"]().SerializeToString())
    Generator(full).generate(PROMPT, 6, progress=False, eos_token_id=-1, kv="fixed")
    counted = reports.summary(full.recording).set_index("metric")
    assert counted.loc["zero-copy views created", "value"] == len(full.recording.views())
    assert counted.loc["alias hazards", "value"] == len(reports.alias_hazards(full.recording))
    assert MEMORY_NOT_RECORDED not in reports.render_html(full.recording)

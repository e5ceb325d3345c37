"""The widgets: each view's model (what it renders for a step, what selecting does),
then the ipywidgets views headless (construct, step, select, live decode, 600 nodes)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pandas as pd
import pytest

import workbench
from workbench import Generator, Recording, models, reports
from workbench.reports import NOT_RECORDED, Frames
from workbench.widgets.model import (
    LivenessModel,
    MemoModel,
    PlanModel,
    SegmentationModel,
    StepCursor,
    ViewsModel,
    explain_walk,
    page_of,
    token_strip,
)

# --------------------------------------------------------------------------- a known recording
# Plan: h = MatMul(x, w); h_r = Reshape(h) [view]; h_t = Transpose(h_r) [view of h];
# g = Relu(h_t); s = NonZero(g) (data-dependent: declines capture); y = Cast(s) (host fallback).
X, W_, H, H_R, H_T, G, S, Y = range(8)


def _nodes(names: dict[int, str] | None = None) -> list[dict]:
    names = names or {}
    spec = [
        ("mm", "MatMul", "native", False, True, None, "", ["x", "w"], ["h"]),
        ("rs", "Reshape", "native", True, True, None, "", ["h"], ["h_r"]),
        ("tr", "Transpose", "native", True, True, None, "", ["h_r"], ["h_t"]),
        ("relu", "Relu", "native", False, True, None, "", ["h_t"], ["g"]),
        ("nz", "NonZero", "native", False, False, "data_dependent_shape", "output shape depends on data",
         ["g"], ["s"]),
        ("cast", "Cast", "host_fallback", False, False, "host_fallback", "runs on onnx.reference", ["s"], ["y"]),
    ]
    return [dict(plan_index=i, name=names.get(i, n), op_type=op, domain="", kernel=k, produces_view=v,
                 capture_supported=ok, capture_reason=r, capture_detail=d, inputs=ins, outputs=outs)
            for i, (n, op, k, v, ok, r, d, ins, outs) in enumerate(spec)]


VALUES = [dict(value_id=i, name=n, dtype=dt, shape=sh, kind="tensor", role=role) for i, (n, dt, sh, role) in
          enumerate([("x", "float", "[batch, 4]", "input"), ("w", "float", "[4, 8]", "initializer"),
                     ("h", "float", "[batch, 8]", "intermediate"), ("h_r", "float", "[batch, 2, 4]", "intermediate"),
                     ("h_t", "float", "[batch, 4, 2]", "intermediate"),
                     ("g", "float", "[batch, 4, 2]", "intermediate"),
                     ("s", "int64", "[3, nnz]", "intermediate"), ("y", "float", "[3, nnz]", "output")])]

#: (slot, phase, batch, memo action, stage2) per step
STEPS = [("primary", "prefill", 2, "primed", "none"), ("primary", "decode", 3, "primed", "none"),
         ("verify", "verify", 3, "ineligible", "none"), ("primary", "decode", 3, "replayed", "validated")]


def unit(batch: int) -> int:
    return batch * 8 * 4


def build_recording(capture: bool = True, memo: bool = True, names: dict[int, str] | None = None,
                    detail: str = "output shape depends on g's values") -> Recording:
    rec = Recording()
    rec.set_static(_nodes(names), VALUES)
    for step, (slot, phase, batch, action, stage2) in enumerate(STEPS):
        rec.begin_step(slot=slot, phase=phase, bindings={"batch": batch})
        u = unit(batch)
        replay = step == 3
        for p in range(6):
            if p == 1:
                rec.view(H_R, H, (batch, 2, 4), (8, 4, 1), 0, 1)
            if p == 2:
                rec.view(H_T, H, (batch, 4, 2), (8, 1, 4), 0, 2)
            mode = ("elided" if p == 1 else "replayed") if replay and p < 4 else "eager"
            rec.node(p, mode, (p + 1) * 1e-6)
        rec.liveness([(X, "input", X, batch * 16, -1, 0, False, -1), (W_, "initializer", W_, 128, -1, 0, False, -1),
                      (H, "owner", H, u, 0, 1, True, -1), (H_R, "view", H, 0, 1, 2, False, -1),
                      (H_T, "view", H, 0, 2, 3, False, -1), (G, "owner", G, u, 3, 4, False, -1),
                      (S, "owner", S, 48, 4, 5, False, -1), (Y, "owner", Y, 48, 5, 6, False, -1)])
        if memo:
            rec.add_row("memo", slot=slot, phase=phase, action=action, reason=f"reason {step} <b>",
                        varying=["batch"] if step else [], invariant_values=3, variant_values=4, resolve_ms=0.1,
                        stage2=stage2, views_reused=2 if replay else 0, dispatch_elided=1 if replay else 0,
                        mismatch_streak=0)
        if capture:
            if step in (1, 3):
                rec.add_row("capture_segments", slot=slot, segment=0, first_node=0, last_node=3, node_count=4,
                            kind="captured", state="captured" if step == 1 else "replayed")
                rec.add_row("capture_segments", slot=slot, segment=1, first_node=4, last_node=5, node_count=2,
                            kind="eager", state="eager")
                rec.add_row("capture_events", slot=slot, segment=0, event="capture" if step == 1 else "replay",
                            reason="warm" if step == 1 else "binding signature unchanged", duration_s=1e-5)
            else:
                rec.add_row("capture_segments", slot=slot, segment=0, first_node=0, last_node=5, node_count=6,
                            kind="eager", state="eager")
            if step == 1:
                rec.add_row("capture_declines", slot=slot, segment=1, plan_index=4, node=_nodes(names)[4]["name"],
                            op_type="NonZero", domain="", reason="data_dependent_shape", detail=detail,
                            symbols=["nnz"])
                rec.add_row("capture_declines", slot=slot, segment=1, plan_index=5, node=_nodes(names)[5]["name"],
                            op_type="Cast", domain="", reason="host_fallback", detail="host kernel", symbols=[])
        if slot == "primary":
            rec.add_row("tokens", token=10 + step, position=4 + step)
        rec.end_step(1e-3 * (step + 1), resident_peak_bytes=1000 * (step + 1))
    return rec


@pytest.fixture
def frames() -> Frames:
    return Frames(build_recording())


@pytest.fixture
def bare() -> Frames:
    """The same steps with neither the memo nor capture segmentation recorded."""
    return Frames(build_recording(capture=False, memo=False))


# --------------------------------------------------------------------------- cursor and paging

def test_cursor_starts_at_the_latest_primary_step_and_moves_within_the_slot(frames):
    c = StepCursor(frames)
    assert (c.slot, c.step, c.steps, c.slots) == ("primary", 3, [0, 1, 3], ["primary", "verify"])
    c.prev()
    assert c.step == 1
    c.first()
    c.prev()  # clamps
    assert c.step == 0
    c.last()
    c.next()
    assert c.step == 3
    c.go(2)  # a step of another slot switches the slot
    assert (c.slot, c.step, c.steps) == ("verify", 2, [2])
    c.set_slot("primary")  # latest primary step at or before 2
    assert c.step == 1
    with pytest.raises(ValueError, match="step 9 was not recorded"):
        c.go(9)


def test_cursor_follows_a_growing_recording_only_when_asked(frames):
    rec = frames.recording
    c = StepCursor(frames)
    c.first()
    seen = []
    c.observe(lambda ch: seen.append(ch["new"]), names="version")
    assert not c.refresh()  # nothing new
    rec.begin_step(slot="primary", phase="decode", bindings={"batch": 3})
    rec.end_step(1e-3)
    assert c.refresh() and seen == [1] and c.step == 0  # not following: stays
    c.follow = True
    rec.begin_step(slot="primary", phase="decode", bindings={"batch": 3})
    rec.end_step(1e-3)
    assert c.refresh() and c.step == 5


def test_page_of_filters_by_all_words_and_clamps_pages():
    df = pd.DataFrame({"name": [f"node{i} {'MatMul' if i % 2 else 'Add'}" for i in range(55)], "n": range(55)})
    p = page_of(df, page=9, size=20)
    assert (p.page, p.pages, p.total, len(p.rows)) == (2, 3, 55, 15)
    assert p.label == "page 3 of 3 · 55 rows"
    q = page_of(df, 0, 20, "matmul NODE1")  # words AND-ed, case-insensitive
    assert q.rows["n"].tolist() == [1, 11, 13, 15, 17, 19]


# --------------------------------------------------------------------------- PlanModel

def test_plan_model_shapes_modes_and_segments_at_a_step(frames):
    m = PlanModel(frames)
    p0, p3 = m.plan(0), m.plan(3)
    assert p0["output_shapes"].tolist()[:4] == ["[2, 8]", "[2, 2, 4]", "[2, 4, 2]", "[2, 4, 2]"]
    assert p3["output_shapes"].tolist()[:4] == ["[3, 8]", "[3, 2, 4]", "[3, 4, 2]", "[3, 4, 2]"]
    assert p3["output_shapes"][4] == "[3, nnz]"  # a data-dependent dim stays symbolic
    assert p3["mode"].tolist() == ["replayed", "elided", "replayed", "replayed", "eager", "eager"]
    assert p3["duration_us"].tolist() == pytest.approx([1, 2, 3, 4, 5, 6])
    assert p0["group"].tolist() == ["warm-up"] * 5 + ["host fallback"]  # warm-up: all eager, no seam
    # a captured node is named by its segment's state, as the Segmentation tab names (and colours) it
    assert p3["group"].tolist() == ["replayed"] * 4 + ["eager seam", "host fallback"]
    assert p3["segment_state"].tolist() == ["replayed"] * 4 + ["eager"] * 2
    assert p3["segment"].tolist() == [0, 0, 0, 0, 1, 1]


def test_plan_model_without_segmentation_colours_by_static_verdict(bare):
    p = PlanModel(bare).plan(3)
    assert p["segment"].isna().all()
    assert p["group"].tolist() == ["capturable"] * 4 + ["declines: data_dependent_shape", "host fallback"]


def test_plan_model_selecting_a_node_gives_its_inputs_outputs_and_verdict(frames):
    m = PlanModel(frames)
    d = m.node(3, "primary", 2)
    assert d["name"] == "tr" and d["op_type"] == "Transpose" and d["produces_view"]
    assert d["inputs"] == [("h_r", "[3, 2, 4]")] and d["outputs"] == [("h_t", "[3, 4, 2]")]
    assert d["mode"] == "replayed" and d["duration"].startswith("3.0 µs, segment ÷ 3 (a replayed segment is timed")
    assert d["segment"] == "segment 0 (captured, replayed)"
    nz = m.node(3, "primary", 4)
    assert nz["capture_supported"] is False and nz["capture_reason"] == "data_dependent_shape"
    assert m.node(3, "primary", 99) is None
    assert m.options()[4] == ("#4 NonZero nz", 4)
    page = m.table(3, "primary", query="host")
    assert page.rows["name"].tolist() == ["cast"]
    assert m.page_of_node(3, "primary", 5, size=2) == 2


# --------------------------------------------------------------------------- SegmentationModel

def test_segmentation_model_declines_in_force_by_reason_and_a_seam(frames):
    m = SegmentationModel(frames)
    assert m.recorded
    per_step = m.segments_per_step("primary")
    assert per_step.groupby("step")["segment"].count().to_dict() == {0: 1, 1: 2, 3: 2}
    assert m.declines(0, "primary").empty  # none recorded yet at the warm-up step
    d3 = m.declines(3, "primary")  # step 1's declines are still in force at step 3
    assert d3["plan_index"].tolist() == [4, 5] and set(d3["step"]) == {1}
    assert m.reasons(3, "primary").set_index("reason")["declines"].to_dict() == {
        "data_dependent_shape": 1, "host_fallback": 1}
    assert m.table(3, "primary", reason="host_fallback").rows["node"].tolist() == ["cast"]
    seam = m.seam(3, "primary", 4)
    assert seam == {"plan_index": 4, "node": "nz", "op_type": "NonZero", "reason": "data_dependent_shape",
                    "detail": "output shape depends on g's values", "symbols": ["nnz"], "segment": 1,
                    "source": "recorded"}
    assert m.seam(3, "primary", 0) is None  # inside a captured segment
    assert m.segments(2, "verify")["kind"].tolist() == ["eager"]


def test_segmentation_model_not_recorded_falls_back_to_static_verdicts(bare):
    m = SegmentationModel(bare)
    assert not m.recorded and m.segments_per_step("primary") is None and m.declines(3, "primary") is None
    assert m.reasons(3, "primary")["reason"].tolist() == ["data_dependent_shape", "host_fallback"]
    assert m.seam(3, "primary", 4)["source"] == "static verdict"
    assert m.table(3, "primary").rows["node"].tolist() == ["nz", "cast"]


# --------------------------------------------------------------------------- MemoModel

def test_memo_model_lanes_and_what_happened_at_a_step(frames):
    m = MemoModel(frames)
    lanes = m.lanes()
    assert set(lanes["lane"]) == {"memo", "stage 2", "capture · primary"}
    memo = lanes[lanes["lane"] == "memo"]
    assert memo["state"].tolist() == ["primed", "primed", "ineligible", "replayed"]
    assert lanes[lanes["lane"] == "capture · primary"]["state"].tolist() == ["capture", "replay"]
    at = m.at(3)
    assert at["lanes"]["memo"].startswith("replayed: reason 3 <b> · varying: batch")
    assert at["lanes"]["stage 2"].startswith("validated: views reused 2, dispatch elided 1")
    assert at["info"]["token"] == 13 and at["info"]["wall_ms"] == pytest.approx(4.0)
    assert m.missing() == []
    lat = m.latency()
    assert lat["tokens_per_s"].tolist()[1] == pytest.approx(500.0) and pd.isna(lat["tokens_per_s"][0])


def test_memo_model_says_what_was_not_recorded(bare):
    m = MemoModel(bare)
    assert m.missing() == ["decode-plan memo", "capture events"]
    assert m.lanes().empty and m.at(3)["lanes"] == {}


# --------------------------------------------------------------------------- ViewsModel

def test_views_model_walk_of_a_transpose(frames):
    m = ViewsModel(frames)
    v = m.views(3)
    assert v["value"].tolist() == ["h_r", "h_t"]
    assert v["contiguous"].tolist() == [True, False]
    assert m.default_value(3) == "h_t"  # the transpose turns back, the reshape does not
    assert m.value_for_node(3, 2) == "h_t" and m.value_for_node(3, 0) is None
    w = m.walk(3, "h_t")
    # h_t[i, j, k] = h[8i + j + 4k]: down the columns of each 2x4 block of h
    assert w.order[:8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert (w.rows, w.cols, w.source_shape, w.source_elements) == (3, 8, (3, 8), 24)
    first, visits = w.grid()
    assert first[0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7] and (visits == 1).all()
    text = explain_walk(w)
    assert "source element 0 + i0·8 + i1·1 + i2·4" in text[1]


def test_view_walk_with_a_broadcast_stride_counts_repeat_reads():
    rec = build_recording()
    rec.begin_step(slot="primary", phase="decode", bindings={"batch": 1})
    rec.view(H_T, H, (1, 4, 2), (0, 0, 1), 8, 2)  # reads h[2:4] four times
    rec.end_step(1e-3)
    w = ViewsModel(Frames(rec)).walk(4, "h_t")
    first, visits = w.grid()
    assert w.element_offset == 2 and w.order.tolist() == [2, 3] * 4
    assert visits.ravel()[2:4].tolist() == [4, 4] and first.ravel()[2:4].tolist() == [0, 1]
    assert any("broadcast" in line for line in explain_walk(w))


# --------------------------------------------------------------------------- LivenessModel

def test_liveness_model_lifetimes_curve_and_bounds(frames):
    m = LivenessModel(frames)
    lt = m.lifetimes(3)
    assert "w" not in set(lt["value"]) and "w" in set(m.lifetimes(3, constants=True)["value"])
    assert lt.set_index("value").loc["h", "category"] == "owner (pinned)"
    u = unit(3)
    assert m.curve(3)["live_bytes"].tolist() == [u, u, u, 2 * u, u + 48, 96]
    assert m.curve(3)["allocated_bytes"].tolist() == [u, u, u, 2 * u, 2 * u + 48, 2 * u + 96]
    mem = m.memory(3)
    plan = frames.recording.memory_plan(3)
    assert (mem["planner_peak_bytes"], mem["lower_bound_bytes"]) == (plan.peak, plan.lower_bound)
    assert mem["lower_bound_bytes"] == 2 * u and mem["resident_peak_bytes"] == 4000
    assert m.highlight(3) == ["g"] and m.highlight(-1) == []
    at = m.live_at(3, 3)
    # h's buffer is still live (h_t is a view of it) though the value h itself is dead
    assert at["live_bytes"] == 2 * u and set(at["values"]) == {"h_t", "g"}


def test_token_strip_marks_tokens_relative_to_the_step(frames):
    s = token_strip(frames, 1, prompt=[1, 2], decode_text=lambda ids: "-".join(map(str, ids)))
    assert s["items"] == [(1, "prompt"), (2, "prompt"), (10, "before"), (11, "current"), (13, "after")]
    assert s["text"] == "1-2-10-11"


def test_widget_models_import_no_front_end():
    import subprocess

    code = ("import sys, workbench.widgets.model, workbench.reports; "
            "bad = [m for m in ('ipywidgets', 'plotly') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- the ipywidgets views

@pytest.fixture(scope="module")
def decoded():
    """A real decode: llama (standard ops), 6 new tokens."""
    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate(list(range(3, 9)), 6, progress=False, eos_token_id=-1)
    return session.recording


def _figure_json(fw) -> str:
    return fw.to_json()


@pytest.mark.parametrize("name", ["PlanView", "SegmentationView", "MemoTimeline", "ViewAliasView", "LivenessView"])
def test_each_view_stands_alone_and_redraws_when_its_step_control_moves(decoded, name):
    import workbench.widgets as wb

    view = getattr(wb, name)(decoded)
    assert view.controls is not None and view.cursor.step == len(decoded) - 1
    figures = [w for w in _walk(view) if _is_figure(w)]
    assert figures, "every view draws at least one plotly figure"
    before = [_figure_json(f) for f in figures]
    label = view.controls.label.value
    view.controls.prev_btn.click()
    assert view.cursor.step == len(decoded) - 2
    assert view.controls.label.value != label and f"step {len(decoded) - 2}" in view.controls.label.value
    # two late decode steps can draw alike (with attention fused, llama's only views are
    # the same from step to step); the prefill never draws like a decode step
    view.controls.slider.value = 0
    assert view.cursor.step == 0 and "step 0" in view.controls.label.value
    first = [_figure_json(f) for f in figures]
    assert before != first, f"{name} did not redraw for the new step"


def _walk(w):
    yield w
    for child in getattr(w, "children", ()):
        yield from _walk(child)


def _is_figure(w) -> bool:
    import plotly.graph_objects as go

    return isinstance(w, go.FigureWidget)


def test_views_say_plainly_what_was_not_recorded(bare):
    from workbench.widgets import MemoTimeline, SegmentationView

    seg = SegmentationView(bare)
    assert NOT_RECORDED in seg.message.value and seg.segments_fig.layout.display == "none"
    memo = MemoTimeline(bare)
    assert "decode-plan memo: not recorded in this recording" in memo.message.value
    assert "capture events: not recorded in this recording" in memo.message.value


def test_memory_views_say_a_lean_trace_did_not_record_them():
    """A session traced without its memory tables (`trace_memory=False`): Liveness and
    Views say so and draw nothing, instead of an empty chart read as "no buffers"."""
    from workbench.reports import MEMORY_NOT_RECORDED
    from workbench.widgets import LivenessView, ViewAliasView

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"),
                                         options=workbench.SessionOptions(trace_memory=False))
    Generator(session).generate(list(range(3, 9)), 4, progress=False, eos_token_id=-1)
    liveness = LivenessView(session.recording)
    assert MEMORY_NOT_RECORDED in liveness.message.value and liveness.figure.layout.display == "none"
    views = ViewAliasView(session.recording)
    assert MEMORY_NOT_RECORDED in views.message.value and views.walk_fig.layout.display == "none"


def test_workbench_selection_is_shared_by_every_view(decoded):
    from workbench.widgets import DecodeWorkbench

    wb = DecodeWorkbench(decoded)
    plan, seg, memo, views, live = wb.views
    assert plan.active and not live.active and live._rendered_key is None  # hidden tabs wait
    # a layout node with a view at the cursor's (last) step; views inside captured
    # segments are restored by the replay, not re-derived, so they have rows only
    # where the step ran them (the eager attention-mask seam here)
    views_now = decoded.views().query(f"step == {wb.cursor.step}")
    transpose = int(views_now.plan_index.iloc[0])
    op = decoded.nodes().set_index("plan_index").op_type[transpose]
    wb.node_pick.value = transpose  # the node picker...
    assert wb.cursor.node == transpose
    assert f"#{transpose} " in plan.detail.value and op in plan.detail.value
    wb.tabs.selected_index = 3  # ...drives the views tab: it shows that node's view
    assert views.pick.value == views.model.value_for_node(wb.cursor.step, transpose) is not None
    wb.tabs.selected_index = 4
    assert live._rendered_key[2] == transpose and f"at node #{transpose}" in live.numbers.value
    plan.select_node(0)  # a click in one view selects everywhere
    assert wb.node_pick.value == 0 and live._rendered_key[2] == 0
    wb.controls.prev_btn.click()
    assert "current" in wb.tokens.value or "background" in wb.tokens.value
    wb.tabs.selected_index = 5
    assert "tokens generated" in wb.summary.value


def test_workbench_replays_a_saved_recording(decoded, tmp_path):
    from workbench.widgets import DecodeWorkbench

    decoded.save(tmp_path / "rec")
    wb = DecodeWorkbench(str(tmp_path / "rec"))
    assert wb.cursor.steps == list(range(len(decoded))) and wb.live is None
    assert wb.progress.layout.display == "none"


def test_workbench_decodes_live_and_shows_every_step():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny"))
    wb = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=5, start=False, eos_token_id=-1,
                         step_delay=0.25)
    versions, steps_seen = [], []
    wb.cursor.observe(lambda c: versions.append(c["new"]), names="version")
    wb.cursor.observe(lambda c: steps_seen.append(c["new"]), names="step")
    result = wb.start().wait(timeout=60)
    assert len(result.tokens) == 5 and len(session.recording) == 5
    assert len(versions) >= 5, "the views refreshed after every step, not only at the end"
    assert steps_seen == [0, 1, 2, 3, 4] and wb.cursor.step == 4  # followed the decode
    assert wb.progress.value == 5 and wb.progress.bar_style == "success"
    assert str(result.tokens[-1]) in wb.tokens.value
    # the views refresh (and the step delay passes) outside the Generator's timed region
    assert max(result.step_times) < 0.25


def test_workbench_appears_before_the_decode_ends_and_makes_figures_only_for_open_tabs():
    """A FigureWidget carries plotly.js (~5 MB the browser evaluates): a workbench that
    made one per view up front showed up only after a short decode had ended."""
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    t0 = time.perf_counter()
    wb = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=6, eos_token_id=-1, step_delay=0.3)
    built = time.perf_counter() - t0
    assert wb.live.running and len(session.recording) < 6, "the constructor returned before the decode ended"
    assert built < 2.0, built
    figures = [w for w in _walk(wb) if _is_figure(w)]
    assert len(figures) <= 1, "only the open tab (Plan) may make a figure"
    wb.wait(timeout=60)
    assert len([w for w in _walk(wb) if _is_figure(w)]) == 1
    wb.tabs.selected_index = 4  # Liveness: its figures are made when it opens
    assert len([w for w in _walk(wb) if _is_figure(w)]) == 2


def test_each_live_decode_gets_its_own_recording():
    """Re-running a DecodeWorkbench cell listed the previous decode's tokens before the
    new prefill: every decode now records into a fresh Recording of its own."""
    from workbench.reports import tokens_frame
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    generator = Generator(session)
    first = DecodeWorkbench(generator, [3, 4, 5], max_new_tokens=4, eos_token_id=-1)
    r1 = first.wait(timeout=60)
    rec1 = session.recording
    second = DecodeWorkbench(generator, [9, 8, 7, 6], max_new_tokens=3, eos_token_id=-1)
    r2 = second.wait(timeout=60)
    rec2 = session.recording
    assert rec2 is not rec1 and second.recording is rec2 and first.recording is rec1
    assert len(rec1) == 4 and len(rec2) == 3  # the first one is kept intact
    assert rec2.steps().phase.iloc[0] == "prefill"
    assert tokens_frame(second.frames).token.tolist() == r2.tokens
    assert tokens_frame(first.frames).token.tolist() == r1.tokens
    strip = token_strip(second.frames, 0, second.prompt)["items"]
    assert [t for t, k in strip if k == "prompt"] == [9, 8, 7, 6] and len(strip) == 4 + 3
    assert rec2.nodes().equals(rec1.nodes()) and rec2.values().equals(rec1.values())
    assert second.cursor.steps == [0, 1, 2]


class _Letters:
    """A stand-in tokenizer (the real ones, GGUFTokenizer / SmolLM2's, need a download)."""

    def decode(self, ids):
        return "".join(" " + chr(97 + i % 26) for i in ids)


def test_tokens_show_as_text_with_a_tokenizer_and_built_in_ids_say_they_are_synthetic():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    plain = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=3, eos_token_id=-1)
    result = plain.wait(timeout=60)
    assert "token ids:" in plain.tokens.value and "synthetic ids" in plain.tokens.value
    texts = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=3, eos_token_id=-1,
                            tokenizer=_Letters())
    texts.wait(timeout=60)
    value = texts.tokens.value
    assert "synthetic" not in value and "tokens:" in value
    last = texts.recording.steps().step.iloc[-1]
    tok = int(workbench.reports.tokens_frame(texts.frames).token.iloc[-1])
    assert f"title='id {tok}'" in value and f"&nbsp;{chr(97 + tok % 26)}</span>" in value  # text, id on hover
    assert "<i> d e f" in value  # the running text, from the tokenizer's decode
    assert f"token {tok} &#x27; {chr(97 + tok % 26)}&#x27;" in texts.controls.label.value and last >= 2
    assert len(result.tokens) == 3
    strip = token_strip(texts.frames, 0, [3], tokenizer=_Letters())
    assert strip["pieces"][0] == " d" and len(strip["pieces"]) == len(strip["items"])


def test_workbench_follows_a_live_speculative_decode_across_slots():
    from workbench.widgets import DecodeWorkbench

    prompt = [7, 8, 9, 7, 8, 9, 7, 8]  # repeats: prompt lookup drafts tokens to verify
    plain = Generator(workbench.InferenceSession(models.gpt2("tiny"))).generate(
        prompt, 10, progress=False, eos_token_id=-1)
    session = workbench.InferenceSession(models.gpt2("tiny"))
    streamed = []
    wb = DecodeWorkbench(Generator(session), prompt, max_new_tokens=10, eos_token_id=-1, speculative=3,
                         on_token=streamed.append, refresh_interval=0.0)
    result = wb.wait(timeout=120)
    assert result.tokens == plain.tokens == streamed  # the caller's on_token still gets every token
    steps = session.recording.steps()
    assert "verify" in set(steps.slot)
    last = steps.iloc[-1]
    assert (wb.cursor.step, wb.cursor.slot) == (last.step, last.slot)  # followed to the newest step
    assert set(wb.controls.slot.options) == set(steps.slot)
    assert wb.progress.value == 10


def test_workbench_stays_consistent_when_used_during_a_live_decode():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    wb = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=8, eos_token_id=-1, step_delay=0.02)
    clicks = 0
    while wb.live.running and clicks < 400:  # the user pokes at every control while it decodes
        wb.controls.prev_btn.click()
        wb.select_node(clicks % 50)
        wb.tabs.selected_index = clicks % 5
        wb.controls.next_btn.click()
        clicks += 1
    result = wb.wait(timeout=120)
    assert clicks > 0 and len(result.tokens) == 8 and len(session.recording) == 8
    assert wb.cursor.steps == list(range(8)) and not wb.cursor.follow  # the user took over
    wb.controls.next_btn.click()
    assert wb.controls.label.value.count("/8)") == 1


def test_workbench_live_decode_reports_errors():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny"))
    wb = DecodeWorkbench(session, [3, 4, 5], max_new_tokens=500)  # past the model's 128 positions
    with pytest.raises(workbench.WorkbenchError, match="positions"):
        wb.wait(timeout=60)
    assert "decode failed" in wb.tokens.value and wb.progress.bar_style == "danger"


def test_workbench_refuses_a_session_that_records_nothing():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny"), workbench.SessionOptions(trace=False))
    with pytest.raises(workbench.WorkbenchError, match="records nothing"):
        DecodeWorkbench(Generator(session), [3, 4], 2)


def test_a_600_node_plan_stays_responsive():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny", num_layers=18))
    Generator(session).generate([3, 4, 5], 3, progress=False, eos_token_id=-1)
    n = len(session.recording.nodes())
    assert n >= 600
    t0 = time.perf_counter()
    wb = DecodeWorkbench(session.recording)
    build = time.perf_counter() - t0
    worst = 0.0
    for tab in range(5):
        wb.tabs.selected_index = tab
        for action in (wb.cursor.prev, wb.cursor.next, lambda: wb.select_node(n // 2)):
            t0 = time.perf_counter()
            action()
            worst = max(worst, time.perf_counter() - t0)
    assert build < 15 and worst < 3, (build, worst)
    # no per-node widgets: the plan is one figure and one page of a table
    assert sum(1 for _ in _walk(wb)) < 150
    assert wb.views[0].table.html.value.count("<tr") <= wb.views[0].table.size + 1
    fw = wb.views[0].figure.widget
    assert sum(len(t.x) for t in fw.data if t.type == "scatter") == n


def test_figures_escape_model_names():
    from workbench.widgets import PlanView

    evil = "<script>alert(1)</script>"
    view = PlanView(Frames(build_recording(names={0: evil})))
    view.cursor.select_node(0)
    figure = json.loads(view.figure.widget.to_json())
    hover = " ".join(str(h) for t in figure["data"] for h in (t.get("hovertext") or []))
    html_text = view.detail.value + view.table.html.value
    for text in (hover, html_text):
        assert evil not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


# --------------------------------------------------------------------------- search and diagnostics

def test_find_ranks_exact_then_as_typed_then_nodes_before_values(frames):
    from workbench.widgets.model import find

    hits = find(frames, "h_t")
    assert list(zip(hits.kind, hits.name, hits.plan_index))[0] == ("value", "h_t", 2)  # made by node #2
    assert list(find(frames, "RELU").name) == ["relu"]
    inputs = find(frames, "x")
    assert ("value", "x", 0) in set(zip(inputs.kind, inputs.name, inputs.plan_index))  # first read by #0
    assert find(frames, "no such thing").empty and find(frames, "  ").empty


def test_the_search_box_moves_every_tab_to_the_node(decoded):
    from workbench.widgets import DecodeWorkbench

    wb = DecodeWorkbench(decoded)
    plan, seg, memo, views, live = wb.views
    # a layout node with a view at the cursor's step (views inside captured segments
    # have rows only where the step ran them)
    with_view = set(decoded.views().query(f"step == {wb.cursor.step}").plan_index)
    nodes = decoded.nodes()
    transpose = nodes[nodes.plan_index.isin(with_view)].iloc[0]
    out = transpose.outputs[0]
    wb.search.value = out  # a value name: jump to the node that makes it
    p = int(transpose.plan_index)
    assert wb.cursor.node == p and wb.node_pick.value == p and f"#{p}" in wb.search_label.value
    assert f"#{p} " in plan.detail.value
    wb.tabs.selected_index = 3
    assert views.pick.value == out
    wb.tabs.selected_index = 4
    assert f"at node #{p}" in live.numbers.value
    wb.tabs.selected_index = 6
    wb.diagnostics.show("diff")
    assert "wb-sel" in wb.diagnostics.table.html.value.split("</style>", 1)[1]  # its rows are highlighted
    wb.search.value = "self_attn/o_proj/MatMul"  # several matches: the first, the rest one pick away
    assert len(wb.search_hits.options) == 4 and wb.search_hits.layout.display is None  # 2 nodes, 2 values
    nodes = decoded.nodes()
    o_proj = nodes[nodes.name.str.endswith("self_attn/o_proj/MatMul")].plan_index.tolist()
    assert wb.cursor.node == o_proj[0]
    wb.search_hits.value = 1
    assert wb.cursor.node == o_proj[1]
    wb.search.value = "nothing is called this"
    assert "no node or value" in wb.search_label.value and wb.cursor.node == o_proj[1]


@pytest.mark.parametrize("how", ["live", "loaded"])
def test_the_diagnostics_tab_runs_every_call_at_the_step(decoded, how, tmp_path):
    from workbench import reports
    from workbench.widgets import DecodeWorkbench
    from workbench.widgets.model import CALLS

    source = decoded
    if how == "loaded":
        decoded.save(tmp_path / "rec")
        source = str(tmp_path / "rec")
    wb = DecodeWorkbench(source)
    d = wb.diagnostics
    assert d._rendered_key is None  # hidden until its tab opens
    wb.tabs.selected_index = 6
    assert wb.tabs.get_title(6) == "Diagnostics" and d.active
    seen = {}
    for call in CALLS:
        d.show(call)
        seen[call] = (d.headline.value, d.table.label.value, d.figure.layout.display)
    assert "% of node time replayed" in seen["coverage"][0] and seen["coverage"][2] is None
    top = reports.seam_costs(decoded).iloc[0]
    assert f"#{int(top.plan_index)} {top.op_type}" in seen["seam costs"][0]
    assert f"· {len(reports.seam_costs(decoded))} rows" in seen["seam costs"][1]
    assert "live at plan index" in seen["peak values"][0] and "x the weights" in seen["resident"][0]
    assert "no alias hazard" in seen["alias hazards"][0]
    assert "4 KV pairs" in seen["KV growth"][0] and seen["KV growth"][2] is None
    assert "step 0 (a) vs step" in seen["diff"][0]
    wb.controls.prev_btn.click()  # a new step redraws the chosen call
    assert f"vs step {wb.cursor.step} (b)" in d.headline.value


def test_the_diagnostics_tab_compares_two_recordings():
    from workbench.widgets import DiagnosticsView

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"), workbench.SessionOptions(capture=False))
    Generator(session).generate(list(range(3, 9)), 6, progress=False, eos_token_id=-1)
    view = DiagnosticsView(build_recording(), compare=session.recording)
    view.show("diff")
    assert "vs the compared one" in view.headline.value and view.diff_controls.layout.display == "none"
    assert "capture_disabled" in view.table.frame.item.tolist()


def test_table_cells_explain_jargon_on_hover():
    from workbench.widgets.table import frame_html

    page = frame_html(pd.DataFrame({"reason": ["host_read", "<b>x</b>"], "slot": ["primary", "verify"]}))
    assert 'title="host_read: capture decline: the kernel reads an input&#x27;s values on the host' in page
    assert 'title="primary: slot primary: the captured graphs for ordinary one-token decode steps' in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_segmentation_selecting_a_seam_opens_its_page_and_the_seam_picker_follows_the_reason(decoded):
    from workbench.widgets import SegmentationView

    view = SegmentationView(decoded)
    view.table.size = 8  # the tiny model's seams fit on fewer pages than a real one's
    rows = view.model.table(view.cursor.step, view.cursor.slot, size=10_000).rows
    assert len(rows) > view.table.size, "needs declines on more than one page"
    late = int(rows["plan_index"].iloc[-1])
    view.cursor.select_node(late)
    assert view.table.page == (len(rows) - 1) // view.table.size > 0
    assert "wb-sel" in view.table.html.value and view.seam_pick.value == late
    reason = str(rows["reason"].iloc[0])
    view.reason.value = reason
    listed = {r.rsplit(" — ", 1)[1] for r, v in view.seam_pick.options if v >= 0}
    assert listed == {reason}
    assert len(view.seam_pick.options) - 1 == int((rows["reason"] == reason).sum())
    view.reason.value = "all reasons"
    assert len(view.seam_pick.options) - 1 == int((rows["plan_index"] >= 0).sum())


def test_the_2x3_transpose_is_drawn_with_numbers_in_read_order():
    from workbench.reports import figures, walk_of

    a = np.arange(6).reshape(2, 3)
    t = a.T
    walk = walk_of(t.shape, [s // t.itemsize for s in t.strides], 0, a.shape, value="a.T", source="a")
    fig = figures.view_walk_figure(walk)
    heat = fig.data[0]
    # source element k (row-major 2x3) is read by view element: 0->0, 1->2, 2->4, 3->1, 4->3, 5->5
    assert [list(r) for r in heat.text] == [["0", "2", "4"], ["1", "3", "5"]]
    assert list(fig.layout.yaxis.ticktext) == ["0", "3"]
    assert "a.T" in fig.layout.title.text and "strides [1, 3]" in fig.layout.title.text


def test_a_real_view_walk_is_legible():
    """64 overlapping cell numbers, overlapping titles and every other row label: a large
    view is drawn in blocks, without cell numbers, with at most 16 row labels."""
    from workbench.reports import figures, view_walk
    from workbench.reports.figures.views import MAX_GRID

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate(list(range(3, 12)), 4, progress=False, eos_token_id=-1)
    rec = session.recording
    last = len(rec) - 1
    v = reports.views_at(rec, last)
    big = max(v.itertuples(index=False), key=lambda r: int(np.prod(r.shape)))
    walk = view_walk(rec, last, big.value)
    fig = figures.view_walk_figure(walk)
    heat = fig.data[0]
    rows, cols = np.asarray(heat.z).shape
    assert rows <= MAX_GRID and cols <= MAX_GRID
    if walk.cols > 16 or walk.rows > 24:
        assert heat.text is None  # no overlapping numbers
    assert len(fig.layout.yaxis.ticktext) <= 16 and len(fig.layout.xaxis.tickvals) <= 16
    title = fig.layout.title.text
    assert "<br><sup>" in title and len(title.split("<br>")[0]) <= 60
    # a wide source: each cell is a block of source elements, and says so
    wide = reports.walk_of((64, 30), (1, 64), 0, (30, 64), value="wide")  # a transpose of a 30x64 source
    assert (wide.rows, wide.cols) == (30, 64)
    wf = figures.view_walk_figure(wide)
    assert np.asarray(wf.data[0].z).shape == (30, 32) and "each cell: 1 x 2 source elements" in wf.layout.title.text
    assert wf.data[0].text is None
    assert wf.data[0].customdata[0][0].startswith("source elements 0..1<br>first read by view element 0")
    assert len(wf.layout.yaxis.ticktext) <= 16


def test_plan_view_says_when_rewrites_kept_every_node(monkeypatch):
    """With the fusion rules off, llama's onnx flavour only relays MatMul weights
    (matvec_layout): the Plan tab says so instead of "none", right under the strip."""
    import workbench.rewrite.fusion as fusion
    from workbench.widgets import PlanView

    monkeypatch.setattr(fusion, "RULES", [])

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    rw = session.recording.rewrites()
    assert set(rw["rule"]) == {"matvec_layout"} and int(rw["nodes_saved"].sum()) == 0
    view = PlanView(session.recording)
    text = view.rewrites.value
    assert "0 nodes folded / fused / removed at load" in text and "no node of the loaded graph was removed" in text
    assert f"({len(rw)} nodes kept, their weights rewritten)" in text
    assert view.children.index(view.rewrites) < view.children.index(view.table)


def test_a_step_change_updates_each_figure_in_place(monkeypatch):
    """`show_figure` is one restyle + relayout for a figure of the same traces: it
    compared the traces' properties, and a FigureWidget's traces carry a `uid` a fresh
    figure's lack, so every step change deleted and re-added every trace -- two full
    plotly.js redraws per figure where one restyle is enough."""
    import plotly.basewidget as base

    from workbench.widgets import DecodeWorkbench

    sent: list[str] = []
    for kind in ("deleteTraces", "addTraces", "update"):
        original = getattr(base.BaseFigureWidget, f"_send_{kind}_msg")

        def spy(self, *args, _kind=kind, _original=original, **kwargs):
            sent.append(_kind)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(base.BaseFigureWidget, f"_send_{kind}_msg", spy)
    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    wb = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=8, eos_token_id=-1)
    wb.wait(timeout=60)
    steps = wb.cursor.steps  # the last two: capture replays at both, so the figures have the same traces
    for tab in (0, 4, len(wb.views) + 1):  # Plan, Liveness, Diagnostics (its seam costs figure)
        wb.tabs.selected_index = tab
        if tab == len(wb.views) + 1:
            wb.diagnostics.show("seam costs")
        wb.select_step(steps[-2])
        sent.clear()
        wb.select_step(steps[-1])
        if tab != len(wb.views) + 1:  # seam costs are the whole decode's: nothing changes there
            assert "update" in sent, (tab, sent)  # the figures were redrawn for the new step ...
        assert "deleteTraces" not in sent and "addTraces" not in sent, (tab, sent)  # ... in place


def test_show_figure_keeps_the_leading_traces_that_match_and_replaces_only_the_rest():
    import plotly.graph_objects as go

    from workbench.widgets.figure import show_figure

    def fig(n_traces: int, offset: int) -> go.Figure:
        return go.Figure([go.Bar(x=[i, i + offset], y=[1, 2], name=f"t{i}") for i in range(n_traces)])

    fw = go.FigureWidget()
    show_figure(fw, fig(4, 1))
    first = list(fw.data)
    show_figure(fw, fig(2, 5))  # two fewer: the first two kept, restyled
    assert len(fw.data) == 2 and all(a is b for a, b in zip(fw.data, first))
    assert [list(t.x) for t in fw.data] == [[0, 5], [1, 6]]
    show_figure(fw, fig(3, 7))
    assert all(a is b for a, b in zip(fw.data[:2], first))
    assert [list(t.x) for t in fw.data] == [[0, 7], [1, 8], [2, 9]]
    show_figure(fw, go.Figure([go.Scatter(x=[1], y=[1])]))  # another type: replaced
    assert len(fw.data) == 1 and fw.data[0].type == "scatter" and fw.data[0] is not first[0]


def test_new_traces_are_drawn_against_their_own_layout(monkeypatch):
    """Switching Diagnostics from capture coverage (x: one tick per step) to seam costs
    (x: µs) added the new bars before the new layout: plotly.js drew them with a tick
    label per µs, which blocked a real browser for tens of seconds (the browser test's
    click timeouts). The traces now come after the layout."""
    import plotly.basewidget as base

    from workbench.widgets import DecodeWorkbench

    dticks: list = []
    original = base.BaseFigureWidget._send_addTraces_msg

    def spy(self, *args, **kwargs):
        dticks.append(self.layout.xaxis.dtick)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(base.BaseFigureWidget, "_send_addTraces_msg", spy)
    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    wb = DecodeWorkbench(Generator(session), [3, 4, 5], max_new_tokens=5, eos_token_id=-1)
    wb.wait(timeout=60)
    wb.tabs.selected_index = len(wb.views) + 1
    assert wb.diagnostics.call.value == "coverage" and wb.diagnostics.figure.widget.layout.xaxis.dtick == 1
    dticks.clear()
    wb.diagnostics.show("seam costs")
    assert dticks == [None]  # the seam costs' bars came after their own (µs) axis

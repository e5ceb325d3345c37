"""The truth at a glance: one decode per widget and Recording, words and
numbers that agree across tabs, theme-following colours, tables that fit their width."""

from __future__ import annotations

import json
import re
import threading
import time

import pandas as pd
import pytest

import workbench
from workbench import Generator, Recording, models, reports
from workbench.reports import Frames
from workbench.widgets.model import PlanModel, SegmentationModel, ViewsModel
from workbench.widgets.model.glance import negative_sizes, summary_frame, warm_up_steps


@pytest.fixture(scope="module")
def tour() -> Frames:
    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate([1, 15, 27, 42, 8, 99], 12, progress=False, eos_token_id=-1)
    return Frames(session.recording)


# --------------------------------------------------------------------------- item 1: two decodes
def test_a_new_live_widget_stops_the_previous_decode_and_never_mixes_the_two():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    generator = Generator(session)
    first = DecodeWorkbench(generator, [3, 4, 5], max_new_tokens=30, eos_token_id=-1, step_delay=0.1)
    deadline = time.monotonic() + 30
    while len(first.live.tokens) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second = DecodeWorkbench(generator, [9, 8, 7, 6], max_new_tokens=5, eos_token_id=-1)  # the re-run cell
    assert not first.live.running and first.live.stopped and first.live.error is None
    r2 = second.wait(timeout=60)
    rec1, rec2 = first.recording, second.recording
    assert rec1 is not rec2 and session.recording is rec2
    n1 = len(rec1)
    assert 2 <= n1 < 30  # stopped at a step boundary: every recorded step whole, one token each
    assert reports.tokens_frame(first.frames).token.tolist() == first.live.tokens
    assert len(rec2) == 5 and rec2.steps().phase.tolist() == ["prefill"] + ["decode"] * 4
    assert reports.tokens_frame(second.frames).token.tolist() == r2.tokens
    assert "step 4</b> (5/5)" in second.controls.label.value  # never the other decode's steps
    assert "took over" in first.tokens.value and first.progress.bar_style == "warning"
    assert "Traceback" not in first.tokens.value + second.tokens.value
    # the stopped decode's steps are its own: tokens follow its prompt, as a fresh decode of it gives
    again = Generator(workbench.InferenceSession(models.llama("tiny", flavor="onnx"))).generate(
        [3, 4, 5], n1, progress=False, eos_token_id=-1)
    assert first.live.tokens == again.tokens


def test_a_session_busy_with_another_decode_gets_a_message_not_a_traceback():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    started, release = threading.Event(), threading.Event()

    def hold(_token):
        started.set()
        release.wait(20)

    worker = threading.Thread(target=lambda: Generator(session).generate(
        [3, 4, 5], 3, progress=False, eos_token_id=-1, on_token=hold))
    worker.start()
    try:
        assert started.wait(20)
        before = session.recording
        wb = DecodeWorkbench(Generator(session), [1, 2], max_new_tokens=3)
        assert wb.busy and "busy" in wb.message.value and "already running" in wb.message.value
        assert wb.live is None and wb.wait() is None
        assert session.recording is before  # the running decode keeps recording into its own Recording
    finally:
        release.set()
        worker.join(30)
    assert len(before) == 3


def test_stop_ends_a_live_decode_after_a_whole_step():
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny"))
    wb = DecodeWorkbench(Generator(session), [3, 4], max_new_tokens=40, eos_token_id=-1, step_delay=0.05)
    while len(wb.live.tokens) < 1:
        time.sleep(0.01)
    assert wb.stop(timeout=30) and wb.wait() is None
    assert len(wb.recording) == len(wb.live.tokens) == len(reports.tokens_frame(wb.frames))


def test_a_saved_live_decode_keeps_its_prompt(tmp_path):
    from workbench.widgets import DecodeWorkbench

    session = workbench.InferenceSession(models.gpt2("tiny"))
    wb = DecodeWorkbench(Generator(session), [7, 8, 9], max_new_tokens=2, eos_token_id=-1)
    wb.wait(timeout=60)
    wb.recording.save(tmp_path / "rec")
    again = DecodeWorkbench(Recording.load(tmp_path / "rec"))
    assert again.prompt == [7, 8, 9]
    assert "color:var(--jp-ui-font-color2" in again.tokens.value and ">7<" in again.tokens.value


# --------------------------------------------------------------------------- item 3: words and numbers
def test_warm_up_steps_say_warm_up_and_captured_nodes_their_segments_state(tour):
    warm = warm_up_steps(tour, "primary")
    events = tour.optional("capture_events")
    first_capture = int(events.loc[events.event == "capture", "step"].min())
    assert warm == set(range(first_capture))
    plan = PlanModel(tour)
    assert set(plan.plan(0, "primary")["group"]) == {"warm-up"}
    assert "eager seam" not in set(plan.plan(1, "primary")["group"])
    later = plan.plan(first_capture + 1, "primary")
    assert {"replayed", "eager seam"} <= set(later["group"]) and "captured" not in set(later["group"])
    segs = SegmentationModel(tour).segments_per_step("primary")
    replayed = segs[(segs.step == first_capture + 1) & (segs.kind == "captured")]
    assert set(replayed.state) == {"replayed"}  # the same word, so the same colour, in both tabs
    assert set(segs.loc[segs.step.isin(warm), "state"]) == {"warm-up"}


def test_one_colour_per_meaning_between_plan_strip_and_segments(tour):
    from workbench.reports.figures import plan_strip_figure, segments_figure
    from workbench.widgets.figure import glance

    step = max(tour.get("steps").step)
    plan = glance(plan_strip_figure(PlanModel(tour).plan(step, "primary")))
    segs = SegmentationModel(tour)
    seg = glance(segments_figure(segs.segments_per_step("primary"), segs.declines(step, "primary"), step))
    colour = {}
    for fig in (plan, seg):
        for t in fig.data:
            if t.type in ("scatter", "bar") and t.name in ("replayed", "captured", "warm-up", "eager seam", "eager"):
                colour.setdefault(t.name, set()).add(t.marker.color)
    assert all(len(c) == 1 for c in colour.values()), colour
    assert colour["replayed"] != colour.get("captured", {None})


def test_a_seam_node_detail_shows_the_steps_decline(tour):
    from workbench.widgets.plan_view import node_detail_html

    step = max(tour.get("steps").step)
    d = reports.declines_at(tour, step, "primary")
    p = int(d.plan_index.iloc[0])
    html = node_detail_html(PlanModel(tour).node(step, "primary", p))
    assert f"declined: <b>{d.reason.iloc[0]}</b>" in html and "static verdict (the op at any step)" in html
    warm = node_detail_html(PlanModel(tour).node(0, "primary", p))
    assert "why eager at this step: <b>warm-up</b>" in warm and "declined" not in warm


def test_summary_labels_totals_and_the_resident_peaks_step(tour):
    s = summary_frame(tour, reports.summary(tour)).set_index("metric")["text"]
    steps = tour.get("steps")
    top = steps.loc[steps.resident_peak_bytes.idxmax()]
    assert f"resident peak (highest step: step {int(top.step)}, {top.phase})" in s.index
    assert "views reused (all steps)" in s.index and "segment bakes (all steps)" in s.index
    assert not any(re.search(r"-\d[\d.]* ?(?:[KMG]i)?B\b", str(t)) for t in s)
    assert negative_sizes("76 nodes folded, -20 B resident") == "76 nodes folded, 20 B less resident"
    assert reports.explain("bake") and reports.explain("warm-up")


def test_memo_tab_says_this_step_and_all_steps_as_the_summary(tour):
    from workbench.widgets import MemoTimeline

    view = MemoTimeline(tour)
    total = int(reports.summary(tour).set_index("metric").loc["views reused", "text"])
    assert f"views reused {total}" in view.at_step.value and "(this step)" in view.at_step.value
    assert "views_reused (this step)" in view.table.html.value.replace("<wbr>", "")
    names = {t.name for t in view.figure.widget.data}
    assert not any(n and n.split()[0] == n.split()[-1] and len(n.split()) == 2 for n in names), names
    assert "graph recorded (capture)" in names
    bake = [t for t in view.figure.widget.data if t.name == "host value baked in (bake)"]
    assert bake and any(x.startswith("×") for x in bake[0].text)


def test_liveness_and_diagnostics_say_which_resident_they_mean(tour):
    from workbench.widgets import DiagnosticsView, LivenessView

    assert "resident peak (this step)" in LivenessView(tour).numbers.value
    d = DiagnosticsView(tour)
    d.show("resident")
    assert "resident in all" in d.headline.value and "executor&#x27;s own buffers" in d.headline.value


def test_diagnostics_diff_opens_on_its_headline_rows(tour):
    from workbench.widgets import DiagnosticsView

    d = DiagnosticsView(tour)
    d.cursor.select_node(40)
    d.show("diff")
    assert d.table.page == 0
    first = d.table.html.value
    assert ">bindings<" in first and ">memo<" in first and "wb-sel" in first


def test_report_collapses_the_prefill_decode_diff(tour, tmp_path):
    out = reports.to_html(tour.recording, tmp_path / "r.html")
    text = open(out).read()
    at = text.index('id="diff"')
    assert "<details><summary>" in text[at:at + 400] and "<details open" not in text[at:at + 400]


# --------------------------------------------------------------------------- items 4, 5, 7, 8
def test_tables_fit_their_width_and_use_the_theme():
    from workbench.widgets.table import frame_html

    df = pd.DataFrame({"duration_us": [1.5], "reason": ["growing_symbol"], "detail": ["x" * 300]})
    out = frame_html(df, selected=lambda r: True)
    assert "table-layout:fixed" in out and "width:100%" in out and "text-overflow:ellipsis" in out
    assert "duration_<wbr>us" in out and 'title="' + "x" * 300 in out  # the whole text on hover
    widths = [float(w) for w in re.findall(r'<col style="width:([\d.]+)%">', out)]
    assert len(widths) == 3 and sum(widths) == pytest.approx(100, abs=0.5)
    for var in ("--jp-layout-color2", "--jp-ui-font-color0", "--jp-brand-color", "--jp-border-color2"):
        assert var in out
    assert "#ffd54f" not in out


def test_plots_follow_the_theme_and_heatmaps_carry_no_nan(tour):
    from workbench.widgets import ViewAliasView

    view = ViewAliasView(tour)
    fig = view.walk_fig.widget
    tpl = fig.layout.template.layout
    assert tpl.paper_bgcolor == "rgba(0,0,0,0)" and tpl.plot_bgcolor == "rgba(0,0,0,0)"
    z = [t for t in fig.data if t.type == "heatmap"][0].z
    json.dumps(z, allow_nan=False)  # NaN is not JSON: the front end warned "Out of range float values"
    assert any(v is None for row in z for v in row)
    assert "Transpose" in view.pick.value  # the text promises a transpose


def test_the_default_view_is_a_transpose(tour):
    last = max(tour.get("steps").step)
    v = ViewsModel(tour)
    name = v.default_value(last)
    views = v.views(last)
    assert views.loc[views.value == name, "op"].iloc[0] == "Transpose"


def test_controls_have_tooltips_and_why_slow_is_one_click(tour):
    from workbench.widgets import DecodeWorkbench

    wb = DecodeWorkbench(tour.recording)
    for w in (wb.controls.play, wb.controls.prev_btn, wb.controls.next_btn, wb.why_slow):
        assert w.tooltip
    assert "stop" in wb.controls.play.tooltip and "repeat" in wb.controls.play.tooltip
    wb.why_slow.click()
    assert wb.tabs.selected_index == 6 and wb.diagnostics.call.value == "seam costs"
    assert "costliest" in wb.diagnostics.headline.value

"""Reports: the HTML report (self-contained, escaped), CSV + parquet export, summary."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_widgets import build_recording

import workbench
from workbench import Generator, models, reports
from workbench.reports import NOT_RECORDED, Frames, figures
from workbench.reports.html import figure_json
from workbench.reports.plan import elided_by

EVIL = ["<script>alert(1)</script>", "</script><script>alert(2)</script>", "<img src=x onerror=alert(3)>",
        "</SCRIPT >x", "<!--", "]]>"]


def evil_model() -> onnx.ModelProto:
    """MatMul -> Reshape (view) -> Transpose (view) -> Relu -> Add: every node and
    intermediate value named with HTML that would run if it reached the page raw."""
    w = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(4, 8) / 32, name="w" + EVIL[4])
    shape = numpy_helper.from_array(np.array([0, 2, 4], dtype=np.int64), name="shape")
    h, hr, ht, g = (f"value {e}" for e in EVIL[:4])
    nodes = [
        helper.make_node("MatMul", ["x", w.name], [h], name=EVIL[0]),
        helper.make_node("Reshape", [h, "shape"], [hr], name=EVIL[1]),
        helper.make_node("Transpose", [hr], [ht], perm=[0, 2, 1], name=EVIL[2]),
        helper.make_node("Relu", [ht], [g], name=EVIL[3]),
        helper.make_node("Neg", [g], ["y" + EVIL[5]], name=EVIL[5]),
    ]
    graph = helper.make_graph(
        nodes, "evil" + EVIL[0], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y" + EVIL[5], TensorProto.FLOAT, ["batch", 4, 2])], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def evil_recording():
    session = workbench.InferenceSession(evil_model())
    rng = np.random.default_rng(0)
    for batch in (2, 3, 3, 3):
        session.run(None, {"x": rng.standard_normal((batch, 4)).astype(np.float32)})
    rec = session.recording
    assert set(EVIL[:4]) <= set(rec.nodes()["name"])
    return rec


class _Scripts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def _check_no_breakout(page: str, n_figures_at_least: int) -> _Scripts:
    parser = _Scripts()
    parser.feed(page)
    scripts = [a for t, a in parser.tags if t == "script"]
    assert all("src" not in a for a in scripts), "self-contained: no external scripts"
    # exactly plotly.js plus one small script per figure
    n_figs = page.count('class="fig"')
    assert len(parser.scripts) == 1 + n_figs and n_figs >= n_figures_at_least
    assert len(parser.scripts[0]) > 1_000_000 and "Plotly" in parser.scripts[0]  # plotly.js, inlined once
    ours = page.replace(parser.scripts[0], "")  # everything the report itself wrote
    for e in EVIL[:4]:
        assert e not in ours, f"unescaped model name {e!r} in the report"
    assert "<img" not in ours.lower() and "img" not in {t for t, _ in parser.tags}
    assert ours.lower().count("<script") == len(parser.scripts)  # no script element but ours
    for body in parser.scripts[1:]:
        assert body.startswith("(function(){var f=") and "Plotly.newPlot" in body
        assert "<" not in body and ">" not in body, "figure JSON must not contain raw angle brackets"
    return parser


def test_html_report_escapes_every_model_name(evil_recording, tmp_path):
    path = reports.to_html(evil_recording, tmp_path / "report.html")
    page = path.read_text(encoding="utf-8")
    parser = _check_no_breakout(page, n_figures_at_least=4)
    # the names are there, readable, in escaped form: in the tables as HTML entities...
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(3)&gt;" in page
    # ...and in the figures as text plotly shows literally (entities), inside \\u-escaped JSON
    plan_fig = next(b for b in parser.scripts[1:] if "Execution plan" in b)
    data = json.loads(plan_fig[len("(function(){var f="):plan_fig.index(";Plotly.newPlot")])
    hover = " ".join(str(h) for t in data["data"] for h in (t.get("hovertext") or []))
    assert "&lt;img src=x onerror=alert(3)&gt;" in hover and "<img" not in hover
    assert "<title>Workbench recording</title>" in page


def test_html_report_escapes_recorded_reasons_and_declines(tmp_path):
    rec = build_recording(names={4: EVIL[0], 5: EVIL[1]}, detail=EVIL[2])
    page = reports.to_html(rec, tmp_path / "r.html", title=EVIL[0]).read_text(encoding="utf-8")
    _check_no_breakout(page, n_figures_at_least=5)
    assert f"<title>{EVIL[0]}" not in page and "<title>&lt;script&gt;" in page
    for section in ("Summary", "Steps", "Capture segmentation", "Zero-copy views", "Buffer liveness"):
        assert section in page


def test_figure_json_cannot_close_a_script_element():
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[EVIL[1], "a & b", "\u2028"], y=[1, 2, 3]), layout={"title": {"text": EVIL[3]}})
    text = figure_json(fig)
    assert not set("<>&") & set(text) and "\u2028" not in text
    data = json.loads(text)
    assert data["data"][0]["x"][0] == EVIL[1] and data["layout"]["title"]["text"] == EVIL[3]


def test_report_says_what_was_not_recorded(tmp_path):
    rec = build_recording(capture=False, memo=False)
    page = reports.to_html(rec, tmp_path / "bare.html").read_text(encoding="utf-8")
    assert f"Capture segmentation: {NOT_RECORDED}" in page
    assert f"decode-plan memo: {NOT_RECORDED}" in page
    s = reports.summary(rec).set_index("metric")
    assert s.loc["capture segmentation", "text"] == NOT_RECORDED and s.loc["decode-plan memo", "text"] == NOT_RECORDED
    assert pd.isna(s.loc["capture segmentation", "value"])


# --------------------------------------------------------------------------- export

def test_export_writes_csv_and_parquet_for_every_frame(tmp_path):
    rec = build_recording()
    index = reports.export(rec, tmp_path / "out")
    expected = {"steps", "nodes", "values", "views", "liveness", "buffer_events", "node_timings", "aliases",
                "materializations", "memo_timeline", "segments", "capture_declines", "capture_events", "tokens",
                "memory_summary", "summary"}
    assert set(index["frame"]) == expected
    for r in index.itertuples(index=False):
        csv = pd.read_csv(r.csv)
        parquet = pd.read_parquet(r.parquet)
        assert len(csv) == len(parquet) == r.rows, r.frame
        assert list(csv.columns) == list(parquet.columns)
    nodes = pd.read_parquet(tmp_path / "out" / "nodes.parquet")
    assert json.loads(nodes["inputs"][0]) == ["x", "w"]  # lists travel as JSON text
    views = pd.read_csv(tmp_path / "out" / "views.csv")
    assert json.loads(views["strides"][1]) == [8, 1, 4]
    steps = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert json.loads(steps["bindings"][0]) == {"batch": 2}
    declines = pd.read_parquet(tmp_path / "out" / "capture_declines.parquet")
    assert declines["reason"].tolist() == ["data_dependent_shape", "host_fallback"]


def test_export_leaves_out_what_was_not_recorded(tmp_path):
    index = reports.export(build_recording(capture=False, memo=False), tmp_path)
    assert not {"segments", "capture_declines", "capture_events", "memo_timeline"} & set(index["frame"])
    assert not (tmp_path / "segments.csv").exists()


# --------------------------------------------------------------------------- summary on a real decode

@pytest.fixture(scope="module")
def decoded():
    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    result = Generator(session).generate(list(range(3, 9)), 8, progress=False, eos_token_id=-1)
    return session.recording, result


def test_summary_agrees_with_the_frames(decoded):
    rec, result = decoded
    s = reports.summary(rec).set_index("metric")
    assert s.loc["nodes", "value"] == len(rec.nodes())
    assert s.loc["tokens generated", "value"] == len(result.tokens) == 8
    memo = rec.memo_timeline()
    assert s.loc["memo replayed", "value"] == (memo.action == "replayed").sum()
    assert s.loc["views reused", "value"] == memo.views_reused.sum()
    decode_ms = rec.steps().query("phase == 'decode'").wall_ms
    assert s.loc["decode step (median)", "value"] == pytest.approx(np.median(decode_ms))
    assert s.loc["decode tokens/s", "text"].endswith("tok/s") and s.loc["prefill", "text"].endswith(" ms")
    assert s.loc["resident peak", "text"].endswith("iB") or s.loc["resident peak", "text"].endswith(" B")
    plan = rec.memory_plan(len(rec) - 1)
    assert s.loc["planner peak (last step)", "value"] == plan.peak
    if "capture_declines" in rec.tables:
        d = rec.table("capture_declines")
        last = d[d.step == d.step.max()]
        for reason, n in last.reason.value_counts().items():
            assert s.loc[f"declines: {reason}", "value"] == n
    text = reports.summary_text(rec)
    assert "[decode]" in text and "tok/s" in text


def test_report_of_a_saved_recording_matches_the_live_one(decoded, tmp_path):
    rec, _ = decoded
    rec.save(tmp_path / "rec")
    loaded = workbench.Recording.load(tmp_path / "rec")
    a = reports.summary(Frames(rec)).drop(columns="value")
    b = reports.summary(Frames(loaded)).drop(columns="value")
    pd.testing.assert_frame_equal(a, b)
    page = reports.to_html(loaded, tmp_path / "loaded.html").read_text(encoding="utf-8")
    assert page.count('class="fig"') >= 5


def test_import_workbench_stays_free_of_the_front_end():
    code = ("import sys, workbench; rec = workbench.Recording(); "
            "bad = [m for m in ('plotly', 'ipywidgets', 'workbench.reports') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- one figure, one definition


def test_elided_nodes_say_which_mechanism_and_stage_2_matches_the_memo(decoded):
    """MemoTimeline's "dispatch elided" (Stage 2) disagreed with the table's elided nodes:
    shape folding and If skipping elide nodes too. Each elided node now says by what."""
    decoded = decoded[0]
    memo = decoded.memo_timeline().set_index("step")
    for step in memo.index[memo["stage2"] == "validated"]:
        p = reports.plan_at_step(decoded, int(step))
        stage2 = p[(p["mode"] == "elided") & (p["elided_by"] == "Stage 2")]
        assert len(stage2) == int(memo.loc[step, "dispatch_elided"])
        assert stage2["produces_view"].all()
        assert (p.loc[p["mode"] != "elided", "elided_by"] == "").all()
    s = reports.summary(decoded).set_index("metric")
    total_elided = int((decoded.node_timings()["mode"] == "elided").sum())
    other = sum(int(s.loc[m, "value"]) for m in s.index if str(m).startswith("elided by "))
    assert int(s.loc["dispatch elided (Stage 2)", "value"]) + other == total_elided


def test_if_skipping_is_labelled_as_not_stage_2():
    assert elided_by("elided", "If", False) == "If skip"
    assert elided_by("elided", "Reshape", True) == "Stage 2"
    assert elided_by("elided", "Concat", False) == "shape fold"
    assert elided_by("eager", "If", False) == ""


def test_replayed_times_are_marked_as_a_segment_share(decoded):
    decoded = decoded[0]
    last = int(decoded.steps().step.iloc[-1])
    p = reports.plan_at_step(decoded, last)
    rep = p[p["mode"] == "replayed"]
    assert len(rep) and rep["timed"].str.startswith("segment ÷ ").all()
    for _, g in rep.groupby("segment"):
        assert (g["timed"] == f"segment ÷ {len(g)}").all()
        assert g["duration_us"].nunique() == 1  # the even split the label announces
    assert (p.loc[p["mode"] == "eager", "timed"] == "node").all()
    fig = figures.plan_strip_figure(p)
    names = [t.name for t in fig.data]
    assert "replayed (µs, segment time ÷ its nodes)" in names


def test_the_plan_strip_labels_every_op_type(decoded):
    decoded = decoded[0]
    p = reports.plan_at_step(decoded, int(decoded.steps().step.iloc[-1]))
    fig = figures.plan_strip_figure(p)
    ops = set(p["op_type"])
    assert len(ops) >= 20 and set(fig.layout.yaxis.tickvals) == ops and fig.layout.yaxis.tickmode == "array"


def test_legends_never_share_a_colour_between_different_facts(decoded):
    decoded = decoded[0]
    f = Frames(decoded)
    fig = figures.memo_figure(reports.mechanism_lanes(f), reports.latency_frame(f))
    markers = {t.name: t.marker.color for t in fig.data if t.type == "scatter"}
    assert {"memo replayed", "stage 2 validated", "capture capture", "capture replay"} <= set(markers)
    assert len(set(markers.values())) == len(markers), markers
    from workbench.reports.figures.memo import LANE_COLORS

    for lane, colors in LANE_COLORS.items():
        assert len(set(colors.values())) == len(colors), lane
    last = int(decoded.steps().step.iloc[-1])
    mem = reports.memory_at(f, last)
    lv = figures.liveness_figure(reports.lifetimes_at(f, last), reports.live_bytes_curve(f, last), mem)
    texts = [a.text for a in lv.layout.annotations]
    assert any(t.startswith("planner peak ") for t in texts) and any(t.startswith("lower bound ") for t in texts)
    lines = {t.name.split(" ")[0] + " " + t.name.split(" ")[1]: t.line.dash for t in lv.data
             if t.name and (t.name.startswith("planner") or t.name.startswith("lower"))}
    assert lines["planner peak"] != lines["lower bound"]


@pytest.fixture(scope="module")
def rewritten():
    """Two models the load-time optimizer rewrites: tied embeddings (a Transpose of the
    embedding table folded) and gpt2 (its Constant nodes folded)."""
    out = {}
    for name, model in (("tied", models.exports.tied_embeddings(models.llama("tiny", flavor="genai"))),
                        ("gpt2", models.gpt2("tiny"))):
        session = workbench.InferenceSession(model)
        Generator(session).generate([3, 4, 5], 3, progress=False, eos_token_id=-1)
        out[name] = session.recording
    return out


def test_load_time_rewrites_show_in_summary_html_and_plan_view(rewritten):
    from workbench.reports.rewrites import rewritten_nodes
    from workbench.widgets import PlanView

    tied, gpt2 = rewritten["tied"], rewritten["gpt2"]
    s = reports.summary(tied).set_index("metric")
    # the folded Transpose, per layer Q/K/V fused into one MatMul + Split (one node fewer)
    # and x * Sigmoid(x) into QuickGelu (one node fewer)
    assert s.loc["load-time rewrites", "value"] == 5
    assert s.loc["load-time rewrites", "text"].startswith("5 nodes folded / fused / removed at load, +128.00 KiB")
    assert "constant_folding 1, matmul_siblings 2, silu 2" in s.loc["load-time rewrites", "text"]
    all_nodes = rewritten_nodes(tied)
    nodes = all_nodes[all_nodes.rule == "constant_folding"]
    assert list(nodes["node"]) == ["/model/embed_tokens/tied/Transpose"]
    assert list(nodes["op_type"]) == ["Transpose"]
    fused = all_nodes[all_nodes.rule == "matmul_siblings"]
    assert "/model/layers.0/mlp/up_proj/MatMul" in set(fused["node"])  # two into two: still not in the plan
    assert not set(fused["node"]) & set(tied.nodes()["name"])
    assert "/model/embed_tokens/tied/Transpose" not in set(tied.nodes()["name"])
    page = reports.render_html(tied)
    assert '<h2 id="rewrites">Load-time rewrites</h2>' in page
    section = page[page.index('id="rewrites"'):page.index('id="capture"')]
    assert "/model/embed_tokens/tied/Transpose" in section and "constant_folding" in section
    view = PlanView(tied)
    assert "Load-time rewrites" in view.rewrites.value
    assert "/model/embed_tokens/tied/Transpose" in view.rewrites.value
    assert "constant_folding" in view.rewrites.value

    g = rewritten_nodes(gpt2)
    g = g[g.rule == "constant_folding"]  # (the tanh GELUs are fused too)
    n_const = int(gpt2.rewrites().query("rule == 'constant_folding'")["nodes_saved"].sum())
    assert n_const > 0 and len(g) == n_const and set(g["op_type"]) == {"Constant"}
    n_all = int(gpt2.rewrites()["nodes_saved"].sum())
    s2 = reports.summary(gpt2).set_index("metric")
    assert s2.loc["load-time rewrites", "text"].startswith(f"{n_all} nodes folded / fused / removed at load")
    assert g["node"].iloc[0] in PlanView(gpt2).rewrites.value


def test_a_folded_unsqueeze_is_labelled_shape_fold_not_stage_2():
    """Shape folding elides Shape -> Gather -> Unsqueeze -> Concat on memo replays; the
    Unsqueeze is a view op, so "produces a view" alone called it Stage 2."""
    for view_plan in (False, True):
        options = workbench.SessionOptions(view_plan=view_plan, capture=False)
        session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"), options)
        Generator(session).generate(list(range(3, 9)), 7, progress=False, eos_token_id=-1)
        rec = session.recording
        memo = rec.memo_timeline().set_index("step")
        last = int(memo.index.max())
        p = reports.plan_at_step(rec, last)
        el = p[p["mode"] == "elided"]
        folded = el[el["elided_by"] == "shape fold"]
        assert {"Shape", "Gather", "Unsqueeze", "Concat"} <= set(folded["op_type"])
        assert folded["produces_view"].any()  # the Unsqueeze
        assert int((el["elided_by"] == "Stage 2").sum()) == int(memo.loc[last, "dispatch_elided"])
        s = reports.summary(rec).set_index("metric")
        assert int(s.loc["elided by shape fold (not Stage 2)", "value"]) > 0


def test_one_latency_definition_everywhere(decoded, tmp_path, capsys):
    """01 printed 4.58 ms/token while the summary said 4.213 ms: now the summary, the
    notebooks and `workbench report` print one number, decode wall time per generated
    token (prefill excluded), and onnxruntime's is measured the same way."""
    from workbench.cli.report import run_report

    rec, result = decoded
    lat = reports.decode_latency(rec)
    decode = rec.steps().query("phase == 'decode'")
    assert lat["decode_tokens"] == len(result.tokens) - 1 == len(decode)
    assert lat["ms_per_token"] == pytest.approx(decode.wall_ms.sum() / (len(result.tokens) - 1))
    s = reports.summary(rec).set_index("metric")
    assert s.loc["decode latency", "value"] == pytest.approx(lat["ms_per_token"])
    assert s.loc["decode latency", "text"].startswith(f"{lat['ms_per_token']:.3f} ms/token (decode wall time per "
                                                      "generated token (prefill excluded)")
    assert s.loc["decode tokens/s", "value"] == pytest.approx(1e3 / lat["ms_per_token"])
    assert reports.per_token_ms([0.002, 0.004], 2) == pytest.approx(3.0)

    run = run_report(models.llama("tiny", flavor="onnx"), [3, 4, 5], 5, out_dir=tmp_path, eos_token_id=-1,
                     label="tiny")
    out = capsys.readouterr().out
    ours = reports.decode_latency(run.sessions["model"].recording)["ms_per_token"]
    summary_line = next(line for line in out.splitlines() if line.strip().startswith("decode latency"))
    latency_line = next(line for line in out.splitlines() if line.strip().startswith("workbench ")
                        and "ms/token" in line)
    assert f"{ours:.3f} ms/token" in summary_line and f"{ours:.3f} ms/token" in latency_line
    assert "decode wall time per generated token (prefill excluded)" in out
    if run.peer is not None:
        assert any(line.strip().startswith("onnxruntime") and "ms/token" in line for line in out.splitlines())


def test_in_place_counts_agree_between_views_and_liveness():
    """Liveness drew purple alias bars while Views said "0 in-place writes": both now
    show the values stored in place, and say which writes a dispatched node made."""
    from workbench.reports.liveness import in_place_at
    from workbench.widgets import ViewAliasView

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate([3, 4, 5], 5, progress=False, eos_token_id=-1)
    rec = session.recording
    last = len(rec) - 1
    lt = reports.lifetimes_at(rec, last)
    bars = int((lt["storage"] == "alias").sum())
    ip = in_place_at(rec, last)
    assert bars > 0 and len(ip) == bars
    dispatched = int((rec.aliases()["step"] == last).sum())
    assert int(ip["written_this_step"].sum()) == dispatched
    view = ViewAliasView(rec)
    view.cursor.go(last)
    view.render(force=True)
    step = view.cursor.step
    n = int((reports.lifetimes_at(rec, step)["storage"] == "alias").sum())
    assert f"{n} values live in an earlier value's buffer (the purple alias bars in Liveness)" in view.alias_head.value
    fig = figures.liveness_figure(lt, reports.live_bytes_curve(rec, last), reports.memory_at(rec, last))
    names = [t.name for t in fig.data]
    assert any(str(nm).startswith("alias (stored in place)") for nm in names)
    s = reports.summary(rec).set_index("metric")
    assert s.loc["in-place writes (dispatched, all steps)", "value"] == len(rec.aliases())


def test_memory_lines_say_what_they_measure():
    from workbench.reports.liveness import MEMORY_MEASURES

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate([3, 4, 5], 3, progress=False, eos_token_id=-1)
    rec = session.recording
    last = len(rec) - 1
    mem = reports.memory_at(rec, last)
    fig = figures.liveness_figure(reports.lifetimes_at(rec, last), reports.live_bytes_curve(rec, last), mem)
    hovers = {t.name.split(" ")[0] + " " + t.name.split(" ")[1]: t.hovertemplate for t in fig.data
              if t.name and t.name.split(" ")[0] in ("planner", "resident", "lower")}
    assert set(hovers) == {"planner peak", "resident peak", "lower bound"}
    assert "caller-bound buffers" in hovers["resident peak"] and "liveness-based allocator" in hovers["planner peak"]
    assert "below the planner peak" in MEMORY_MEASURES["resident peak"]
    from workbench.widgets import LivenessView
    lv = LivenessView(rec)
    lv.render(force=True)
    assert "<abbr title='the arena a liveness-based allocator" in lv.numbers.value
    assert "resident peak (this step)</abbr>" in lv.numbers.value  # the Liveness tab names its scope


def test_unnamed_dims_read_question_mark_with_the_symbol_on_hover():
    from workbench.reports.plan import substitute_shape
    from workbench.widgets.model import PlanModel

    assert substitute_shape("[unk__0, 8]", {}) == "[?, 8]"
    assert substitute_shape("[batch, nnz]", {"batch": 2}) == "[2, nnz]"
    session = workbench.InferenceSession(models.phi3("tiny"))
    Generator(session).generate([3, 4, 5], 3, progress=False, eos_token_id=-1)
    rec = session.recording
    last = len(rec) - 1
    p = reports.plan_at_step(rec, last)
    assert not p["output_shapes"].str.contains("unk__").any()
    hit = p[p["unknown_dims"] != ""].iloc[0]
    assert "?" in hit["output_shapes"] and hit["unknown_dims"].startswith("unk__")
    fig = figures.plan_strip_figure(p)
    hovers = [h for t in fig.data if t.hovertext is not None for h in t.hovertext]
    assert any(f"(? = {hit['unknown_dims']}: a dynamic dimension" in h for h in hovers)
    detail = PlanModel(Frames(rec)).node(last, None, int(hit["plan_index"]))
    assert any("(? = unk__" in s for _, s in detail["outputs"])

"""Where a step's wall time went (reports.step_breakdown): the parts sum to the wall
time, their spread over steps per phase, plain run loops, the peer ratio carried in
the recording, the summary / HTML lines, and recordings that lack some data."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench import Generator, InferenceSession, SessionOptions, models, reports
from workbench.trace import Recording

EVIL = '<img src=x onerror="alert(1)">'


@pytest.fixture(scope="module")
def decoded():
    session = InferenceSession(models.llama("tiny", seed=0), options=SessionOptions(trace=True))
    Generator(session).generate([1, 2, 3, 4], 12, progress=False, eos_token_id=-1)
    return session.recording


def _plain_model() -> onnx.ModelProto:
    """x -> MatMul -> Relu -> y, one node named with markup (a model-derived name)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], np.random.default_rng(0).standard_normal(64).tolist())
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name=EVIL), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def plain():
    session = InferenceSession(_plain_model().SerializeToString(), options=SessionOptions(trace=True))
    for run in range(8):
        session.run(None, {"x": np.full((2, 8), run, np.float32)})
    return session.recording


def _assert_parts_sum_to_wall(rec):
    b = reports.step_breakdown(rec)
    assert list(b.columns) == reports.BREAKDOWN_COLUMNS
    assert set(b["part"]) <= set(reports.STEP_PARTS)
    wall = rec.steps().set_index("step")["wall_ms"] * 1e3
    per_step = b.groupby("step")["us"].sum()
    assert set(per_step.index) == set(wall.index)
    np.testing.assert_allclose(per_step.to_numpy(), wall.loc[per_step.index].to_numpy(), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(b.groupby("step")["share"].sum().to_numpy(), 1.0, rtol=1e-9)
    parts = reports.step_parts(rec)
    cols = [f"{p}_us" for p in reports.STEP_PARTS]
    np.testing.assert_allclose(parts[cols].sum(axis=1), parts["wall_us"], rtol=1e-9, atol=1e-6)


def test_the_parts_of_every_step_sum_to_its_wall_time(decoded):
    _assert_parts_sum_to_wall(decoded)
    b = reports.step_breakdown(decoded)
    t = decoded.node_timings()
    # every µs a node measured is in kernels, seams or replay, by its op type
    nodes = b[b["part"].isin(["kernels", "seams", "replay"])].groupby("step")["us"].sum()
    np.testing.assert_allclose(nodes.to_numpy(), t.groupby("step")["duration_us"].sum().loc[nodes.index].to_numpy())
    assert set(b.loc[b["part"] == "kernels", "op_type"]) <= set(t["op"])
    # the memo's resolve time is the shapes part
    memo = decoded.memo_timeline().set_index("step")["resolve_ms"] * 1e3
    shapes = b[b["part"] == "shapes"].set_index("step")["us"]
    np.testing.assert_allclose(shapes.to_numpy(), memo.loc[shapes.index].to_numpy())


def test_capture_replay_and_seams_land_in_their_parts(decoded):
    parts = reports.step_parts(decoded).set_index("step")
    ev = decoded.capture_events()
    captured = int(ev.loc[ev["event"] == "capture", "step"].iloc[0])
    replayed = sorted(set(ev.loc[ev["event"] == "replay", "step"]))
    assert parts.loc[captured, "capture_us"] > 0
    assert (parts.loc[replayed, "replay_us"] > 0).all() and (parts.loc[replayed, "kernels_us"] == 0).all()
    # after the segmentation, the eager nodes are its seams: their op types come from the declines
    b = reports.step_breakdown(decoded)
    seam_ops = set(b.loc[(b["part"] == "seams") & b["step"].isin(replayed), "op_type"])
    assert seam_ops and seam_ops <= set(decoded.capture_declines()["op_type"])
    assert (parts.loc[[s for s in parts.index if s < captured], "seams_us"] == 0).all()  # warm-up: no seams yet


def test_the_spread_is_per_phase_with_ordered_percentiles(decoded):
    spread = reports.breakdown_spread(decoded)
    assert list(spread.columns) == reports.SPREAD_COLUMNS
    assert list(dict.fromkeys(spread["phase"])) == ["prefill", "decode"]
    assert set(spread["part"]) == {"wall", *reports.STEP_PARTS}
    assert (spread["p10_us"] <= spread["median_us"] + 1e-9).all() and (spread["median_us"] <= spread["p90_us"] + 1e-9).all()
    dec = spread[spread["phase"] == "decode"].set_index("part")
    walls = reports.step_parts(decoded).query("phase == 'decode'")["wall_us"]
    assert dec.loc["wall", "steps"] == len(walls) == 11
    assert dec.loc["wall", "median_us"] == pytest.approx(float(np.median(walls)))
    assert dec.drop(index="wall")["share"].sum() == pytest.approx(1.0)
    ops = reports.breakdown_spread(decoded, by="op_type")
    assert {"MatMul"} <= set(ops.loc[(ops["phase"] == "prefill") & (ops["part"] == "kernels"), "op_type"])
    with pytest.raises(ValueError):
        reports.breakdown_spread(decoded, by="node")


def test_a_plain_run_loop_has_a_breakdown_too(plain):
    assert set(plain.steps()["phase"]) == {""}
    _assert_parts_sum_to_wall(plain)
    spread = reports.breakdown_spread(plain)
    assert set(spread["phase"]) == {"run"} and spread.loc[spread["part"] == "wall", "steps"].iloc[0] == 8
    lines = reports.breakdown_lines(plain)
    assert len(lines) == 1 and lines[0].startswith("decode step median")


def test_seam_rankings_show_their_spread_over_steps(decoded):
    seams = reports.seam_costs(decoded)
    for col in ("p10_us", "median_us", "p90_us"):
        assert col in seams.columns and col in reports.seam_costs(decoded, by="reason").columns
    top = seams.iloc[0]
    t = decoded.node_timings()
    first = decoded.capture_declines()["step"].min()
    st = decoded.steps()
    steps = st[(st["phase"] == "decode") & (st["step"] >= first)]["step"]
    per_step = t[t["step"].isin(steps) & (t["plan_index"] == top.plan_index)].groupby("step")["duration_us"].sum()
    assert top.median_us == pytest.approx(float(per_step.median()))
    assert top.p10_us == pytest.approx(float(per_step.quantile(0.1)))
    assert top.p10_us <= top.median_us <= top.p90_us
    assert "median" in reports.summary(decoded).set_index("metric").loc["costliest seam reason", "text"]


def test_summary_and_html_carry_the_breakdown_and_the_peer_ratio(decoded, tmp_path):
    s = reports.summary(decoded)
    assert s.query("section == 'time' and metric == 'step breakdown'")["text"].str.startswith("decode step").any()
    assert "no peer measurement" in s.set_index("metric").loc["onnxruntime latency", "text"]
    rec = Recording.load(_saved(decoded, tmp_path / "a"))
    ours = reports.decode_latency(rec)["ms_per_token"]
    rec.add_row(reports.PEER_TABLE, runtime="onnxruntime", ms_per_token=ours / 2.5, tokens_identical=True)
    peer = reports.peer_latency(rec)
    assert peer["ratio"] == pytest.approx(2.5)
    s = reports.summary(rec).set_index("metric")
    assert s.loc["workbench / onnxruntime", "value"] == pytest.approx(2.5)
    assert s.loc["workbench / onnxruntime", "text"] == "2.50x; tokens identical"
    page = reports.render_html(rec)
    assert "Where the step time goes" in page and "workbench / onnxruntime: 2.50x" in page
    # the ratio survives a save and load (it is a table of the recording)
    again = Recording.load(_saved(rec, tmp_path / "b"))
    assert reports.peer_latency(again)["ratio"] == pytest.approx(2.5)


def test_the_html_section_escapes_model_names(plain):
    page = reports.render_html(plain)
    assert "Where the step time goes" in page
    assert EVIL not in page and "&lt;img src=x" in page


def test_a_recording_lacking_data_says_what_is_missing():
    rec = Recording()
    rec.set_static([{"plan_index": 0, "name": "n0", "op_type": "Relu", "domain": "", "kernel": "native",
                     "produces_view": False, "capture_supported": True, "capture_reason": None,
                     "capture_detail": None, "inputs": ["x"], "outputs": ["y"]}],
                   [{"value_id": 0, "name": "x", "dtype": "float", "shape": "[2]", "kind": "tensor", "role": "input"}])
    for _ in range(3):
        rec.begin_step(slot="primary", phase="")
        rec.node(0, "eager", 5e-6)
        rec.end_step(20e-6, resident_peak_bytes=0)
    rec.begin_step(slot="primary", phase="")  # still open: no wall time, left out
    _assert_parts_sum_to_wall(_closed(rec))
    parts = reports.step_parts(rec)
    assert len(parts) == 3 and parts["kernels_us"].to_numpy() == pytest.approx([5.0] * 3)
    missing = reports.breakdown_missing(rec)
    assert any("shape resolution" in m for m in missing) and any("capture recording" in m for m in missing)
    s = reports.summary(rec)
    assert s.query("metric == 'not split out'")["text"].str.contains(reports.NOT_RECORDED).any()
    assert reports.join_peer_profile(rec).empty and reports.peer_latency(rec) is None
    assert "Where the step time goes" in reports.render_html(rec)
    assert reports.step_breakdown(Recording()).empty


def _closed(rec: Recording) -> Recording:
    """The steps of `rec` with a wall time (an open step has none)."""
    out = Recording()
    out.set_static(rec.nodes().to_dict("records"), rec.values().to_dict("records"))
    for r in rec.steps().itertuples(index=False):
        if math.isnan(r.wall_ms):
            continue
        out.begin_step(slot=r.slot, phase=r.phase)
        for n in rec.node_timings().query("step == @r.step").itertuples(index=False):
            out.node(int(n.plan_index), n.mode, n.duration_us / 1e6)
        out.end_step(r.wall_ms / 1e3, resident_peak_bytes=0)
    return out


def _saved(rec: Recording, path) -> str:
    rec.save(str(path))
    return str(path)

"""reports.peer_profile / join_peer_profile: onnxruntime's own profiler output (a real
profile made here), per node, joined with a workbench recording of the same model by
node name; `workbench report` / `demo` carry the profile and the latency ratio in the
recording, so the summary and the HTML report show them."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from workbench import Generator, InferenceSession, SessionOptions, models, reports
from workbench.cli.main import main
from workbench.cli.report import run_report
from workbench.trace import Recording

PROMPT, STEPS = [1, 2, 3, 4], 6


@pytest.fixture(scope="module")
def model():
    return models.llama("tiny", seed=0)


@pytest.fixture(scope="module")
def profile_path(model, tmp_path_factory):
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path_factory.mktemp("ort") / "profile")
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    Generator(session).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    return session.end_profiling()


@pytest.fixture(scope="module")
def ours(model):
    session = InferenceSession(model, options=SessionOptions(trace=True))
    Generator(session).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    return session.recording


def test_the_profile_per_node(profile_path):
    prof = reports.peer_profile(profile_path)
    assert list(prof.columns) == reports.PROFILE_COLUMNS
    raw = [e for e in json.load(open(profile_path)) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    assert prof["calls"].sum() == len(raw)
    assert prof["total_us"].sum() == pytest.approx(sum(e["dur"] for e in raw))
    assert (prof["runs"] == STEPS).all()  # one model run per token: the prompt, then STEPS - 1 decodes
    assert set(prof["provider"]) == {"CPUExecutionProvider"}
    assert "MatMul" in set(prof["op_type"]) and not prof["node"].str.endswith("_kernel_time").any()
    assert prof["total_us"].is_monotonic_decreasing
    assert (prof["run_us"] > 0).all()
    decode = reports.peer_profile(profile_path, skip_runs=1)  # the prefill run left out
    assert (decode["runs"] == STEPS - 1).all() and decode["calls"].sum() < prof["calls"].sum()


def test_joined_with_our_recording_by_node_name(ours, profile_path, model):
    theirs = reports.peer_profile(profile_path, skip_runs=1)
    j = reports.join_peer_profile(ours, theirs)
    assert list(j.columns) == reports.JOIN_COLUMNS
    assert j["diff_us"].abs().is_monotonic_decreasing
    found = j.groupby("found_in")["node"].apply(set)
    plan = set(ours.nodes()["name"])
    assert found["both"] <= plan and found["both"] <= set(theirs["node"])
    # onnxruntime fused the layer norms: its fused node names are not in our plan
    assert any("SimplifiedLayerNormFusion" in n for n in found["onnxruntime only"])
    assert found["onnxruntime only"].isdisjoint(plan)
    # our plan's fused nodes (workbench's own rewrites) are not in its profile
    assert found["workbench only"] == plan - set(theirs["node"])
    # ours: node time per decode step; theirs: kernel time per run
    both = j[j["found_in"] == "both"].iloc[0]
    t = ours.node_timings()
    dec = ours.steps().query("phase == 'decode'")["step"]
    expect = t[t["step"].isin(dec) & (t["node"] == both.node)]["duration_us"].sum() / len(dec)
    assert both.ours_us == pytest.approx(expect)
    assert both.peer_us == pytest.approx(float(theirs.set_index("node").loc[both.node, "us_per_run"]))
    assert both.ratio == pytest.approx(both.ours_us / both.peer_us)
    # a replayed node's time is its segment's, split: the join says so
    replayed = set(t.loc[t["mode"] == "replayed", "node"])
    assert set(j.loc[j["ours_split"], "node"]) == replayed & set(j["node"])


def test_a_recording_carries_the_profile_into_summary_html_and_a_saved_copy(ours, profile_path, tmp_path):
    ours.save(str(tmp_path / "a"))
    rec = Recording.load(str(tmp_path / "a"))
    prof = reports.peer_profile(profile_path, skip_runs=1)
    rec.add_rows("peer_profile", tuple(reports.PROFILE_COLUMNS),
                 [tuple(r) for r in prof.itertuples(index=False, name=None)])
    rec.save(str(tmp_path / "b"))
    again = Recording.load(str(tmp_path / "b"))
    kept = reports.recorded_peer_profile(again)
    assert kept is not None and list(kept["node"]) == list(prof["node"])
    lines = reports.summary(again).query("metric == 'vs onnxruntime profile'")["text"].tolist()
    assert lines[0].startswith("node time per decode step: workbench")
    assert "fused or folded away there" in lines[1]
    assert "profiled runs took" in lines[2]
    page = reports.render_html(again)
    assert "ours vs onnxruntime&#x27;s profile" in page or "ours vs onnxruntime's profile" in page
    assert "SimplifiedLayerNormFusion" in page


def test_an_empty_or_missing_profile_is_said_not_raised(ours, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert reports.peer_profile(empty).empty
    assert reports.join_peer_profile(ours, reports.peer_profile(empty)).empty
    assert reports.join_peer_profile(ours).empty and reports.peer_lines(ours) == []


def test_workbench_report_profiles_onnxruntime_and_carries_the_ratio(model, tmp_path, capsys):
    run = run_report(model, PROMPT, STEPS, out_dir=tmp_path / "r", eos_token_id=-1, label="tiny")
    printed = capsys.readouterr().out
    assert run.code == 0 and "tokens identical" in printed
    rec = run.sessions["model"].recording
    peer = reports.peer_latency(rec)
    printed_ratio = float(printed.split("workbench / onnxruntime: ")[1].split("x")[0])
    assert peer is not None and round(peer["ratio"], 2) == pytest.approx(printed_ratio)
    assert reports.recorded_peer_profile(rec) is not None
    assert "vs onnxruntime profile" in printed and "[time]" in printed
    page = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert f"workbench / onnxruntime: {peer['ratio']:.2f}x" in page
    trace = json.loads((tmp_path / "r" / "trace.json").read_text())
    assert any(e.get("cat") == "node" for e in trace["traceEvents"])
    frames = tmp_path / "r" / "frames"
    assert (frames / "peer.csv").exists() and (frames / "peer_profile.csv").exists()
    # without the profile: the ratio stays, the per-node comparison is not made
    bare = run_report(model, PROMPT, STEPS, out_dir=tmp_path / "s", eos_token_id=-1, peer_profile=False)
    assert reports.recorded_peer_profile(bare.sessions["model"].recording) is None
    assert reports.peer_latency(bare.sessions["model"].recording) is not None


def test_the_demo_compares_with_onnxruntime(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--builtin", "--tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "not installed" not in out
    assert "workbench / onnxruntime: " in out and "tokens identical" in out
    s = out.split("[decode]")[1]
    assert "onnxruntime latency" in s and "workbench / onnxruntime" in s
    assert np.isfinite(float(out.split("workbench / onnxruntime: ")[1].split("x")[0]))

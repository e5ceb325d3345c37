"""reports.to_chrome_trace: a recording as Chrome trace-event JSON (Perfetto,
chrome://tracing): valid JSON, steps > segments > nodes nested on one track per slot,
capture / replay / retire instants with their reason, live-bytes counters, model
names kept exactly through JSON, and the same trace from a saved-then-loaded recording."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench import Generator, InferenceSession, SessionOptions, models, reports
from workbench.trace import Recording

ODD = 'mat"mul\\ </script>\n\u2028é'
EPS = 1e-6


@pytest.fixture(scope="module")
def decoded():
    session = InferenceSession(models.llama("tiny", seed=0), options=SessionOptions(trace=True))
    Generator(session).generate([1, 2, 3, 4], 10, progress=False, eos_token_id=-1)
    rec = session.recording
    # a retire, as a binding change would log it (the tiny llama keeps its graphs)
    rec.add_row("capture_events", slot="primary", segment=0, event="retire",
                reason="binding_changed: input address", duration_s=0.0)
    return rec


def _load(path) -> dict:
    def no_constants(name):  # NaN / Infinity are not JSON
        raise ValueError(f"not JSON: {name}")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constants)


@pytest.fixture(scope="module")
def trace(decoded, tmp_path_factory):
    return _load(reports.to_chrome_trace(decoded, tmp_path_factory.mktemp("t") / "trace.json"))


def test_it_is_trace_event_json_with_named_tracks(trace, decoded):
    ev = trace["traceEvents"]
    assert isinstance(ev, list) and ev
    assert {e["ph"] for e in ev} == {"M", "X", "i", "C"}
    meta = {(e["name"], e["tid"]): e["args"] for e in ev if e["ph"] == "M"}
    assert meta[("process_name", 0)]["name"] == "workbench recording"
    assert meta[("thread_name", 1)]["name"] == "slot primary"
    for e in ev:
        if e["ph"] != "M":
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    steps = [e for e in ev if e.get("cat") == "step"]
    assert len(steps) == len(decoded)
    walls = decoded.steps()["wall_ms"].to_numpy() * 1e3
    np.testing.assert_allclose([e["dur"] for e in steps], walls)


def test_nodes_and_segments_nest_inside_their_step_on_the_same_track(trace, decoded):
    ev = trace["traceEvents"]
    steps = {e["args"]["step"]: e for e in ev if e.get("cat") == "step"}
    nodes = [e for e in ev if e.get("cat") == "node"]
    assert len(nodes) == len(decoded.node_timings())
    for n in nodes:
        s = steps[n["args"]["step"]]
        assert n["tid"] == s["tid"]
        assert s["ts"] - EPS <= n["ts"] and n["ts"] + n["dur"] <= s["ts"] + s["dur"] + EPS
    segs = [e for e in ev if e.get("cat") == "segment"]
    assert {"segment 0 (replayed)", "segment 0 (captured)"} <= {e["name"] for e in segs}
    for g in segs:
        s = steps[g["args"]["step"]]
        assert s["ts"] - EPS <= g["ts"] and g["ts"] + g["dur"] <= s["ts"] + s["dur"] + EPS
        inside = [n for n in nodes if n["args"]["step"] == g["args"]["step"]
                  and g["args"]["first_node"] <= n["args"]["plan_index"] <= g["args"]["last_node"]]
        assert inside and all(g["ts"] - EPS <= n["ts"] and n["ts"] + n["dur"] <= g["ts"] + g["dur"] + EPS
                              for n in inside)
    # a node's own time is in its args, and its bar is that long (nothing was scaled here)
    n = max(nodes, key=lambda e: e["args"]["duration_us"])
    assert n["dur"] == pytest.approx(n["args"]["duration_us"])


def test_instants_carry_their_reason(trace, decoded):
    inst = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    by = {}
    for e in inst:
        by.setdefault(e["name"], []).append(e)
    ev = decoded.capture_events()
    for kind in ("capture", "replay", "retire"):
        assert len(by[kind]) == int((ev["event"] == kind).sum()), kind
    assert by["capture"][0]["args"]["reason"].startswith("warm step seen; recording")
    assert by["replay"][0]["args"]["reason"] == "binding signature unchanged"
    assert by["retire"][0]["args"]["reason"] == "binding_changed: input address"
    assert all(e["s"] == "t" and e["tid"] == 1 for e in inst)
    steps = {e["args"]["step"]: e for e in trace["traceEvents"] if e.get("cat") == "step"}
    for e in inst:  # each inside its step
        s = steps[e["args"]["step"]]
        assert s["ts"] - EPS <= e["ts"] <= s["ts"] + s["dur"] + EPS


def test_live_bytes_counters_come_from_the_liveness_rows(trace, decoded):
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counters and all(e["name"] == "live bytes (primary)" for e in counters)
    last = len(decoded) - 1
    curve = reports.live_bytes_curve(decoded, last)
    steps = {e["args"]["step"]: e for e in trace["traceEvents"] if e.get("cat") == "step"}
    s = steps[last]
    mine = [e["args"]["live"] for e in counters if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
    assert max(mine) == int(curve["live_bytes"].max()) > 0


def _odd_model() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name=ODD)], "odd",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_model_names_survive_json_exactly(tmp_path):
    session = InferenceSession(_odd_model().SerializeToString(), options=SessionOptions(trace=True))
    for _ in range(3):
        session.run(None, {"x": np.ones((2, 3), np.float32)})
    path = reports.to_chrome_trace(session.recording, tmp_path / "odd.json")
    assert "</script>" in path.read_text(encoding="utf-8")  # JSON, not HTML: json escapes quotes and controls
    names = {e["name"] for e in _load(path)["traceEvents"] if e.get("cat") == "node"}
    assert names == {ODD}
    steps = [e for e in _load(path)["traceEvents"] if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == ["step 0 (run)", "step 1 (run)", "step 2 (run)"]


def test_a_saved_then_loaded_recording_gives_the_same_trace(decoded, trace, tmp_path):
    decoded.save(str(tmp_path / "rec"))
    loaded = Recording.load(str(tmp_path / "rec"))
    again = _load(reports.to_chrome_trace(loaded, tmp_path / "again.json"))
    assert again == trace


def test_a_recording_without_capture_or_liveness_still_traces(tmp_path):
    rec = Recording()
    rec.set_static([{"plan_index": 0, "name": "n", "op_type": "Relu", "domain": "", "kernel": "native",
                     "produces_view": False, "capture_supported": True, "capture_reason": None,
                     "capture_detail": None, "inputs": [], "outputs": []}], [])
    rec.begin_step()
    rec.node(0, "eager", 2e-6)
    rec.end_step(10e-6, resident_peak_bytes=0)
    rec.begin_step()  # open: no wall time yet, left out
    ev = _load(reports.to_chrome_trace(rec, tmp_path / "bare.json"))["traceEvents"]
    assert [e["cat"] for e in ev if e["ph"] == "X"] == ["step", "node"]
    assert not [e for e in ev if e["ph"] in ("i", "C")]

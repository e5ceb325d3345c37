"""The capture lifecycle of a slot as one object: `SlotCapture.next_action` is the
warm-up -> capture -> replay counter, each `CapturedGraph` knows what it recorded
against (`mismatch` gives the retire reason), replays itself and frees what it held."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from test_capture_holds import _mlp_nodes, _model

import workbench
from workbench.executor.capture import SlotCapture


def test_the_slot_warms_up_then_captures_then_replays():
    cap = SlotCapture()
    assert cap.next_action(steady=True, fold_pending=False) == "warm_up"  # no eager step yet
    cap.warm = True
    assert cap.next_action(steady=True, fold_pending=True) == "warm_up"  # a fold to check first
    assert cap.next_action(steady=True, fold_pending=False) == "capture"
    assert cap.next_action(steady=False, fold_pending=False) == "warm_up"  # a re-planned step
    cap.graphs[0] = object()
    assert cap.next_action(steady=True, fold_pending=True) == "replay"
    cap.graphs.clear()
    cap.all_seams = True  # the last cut captured nothing: run the plan eagerly as it is
    assert cap.next_action(steady=True, fold_pending=False) == "eager"
    assert cap.next_action(steady=False, fold_pending=False) == "warm_up"


def _all_seams_model():
    """Expand by a fed shape (a host read: a seam) then one Neg (a run too short to
    record): a plan with nothing to capture."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["wide"]), helper.make_node("Neg", ["wide"], ["y"])], "seams",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "L"]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_plan_cut_into_seams_only_is_not_cut_again_every_step(monkeypatch):
    """The first steady step cuts the plan, finds nothing to record, and later steady
    steps run it eagerly without cutting it again (each cut costs about as much as the
    tiny step itself); a step with new shapes re-plans and cuts it once more. The seams
    stay reported at every step, and every run's values are onnxruntime's (inputs at
    stable addresses, new contents)."""
    import onnxruntime as ort

    from workbench import reports
    from workbench.executor.capture_runner import CaptureRunner

    cuts = []
    real = CaptureRunner.segment
    monkeypatch.setattr(CaptureRunner, "segment", lambda self, *a: (cuts.append(1), real(self, *a))[1])
    model = _all_seams_model()
    session = workbench.InferenceSession(model.SerializeToString())
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    rec, seams = session.recording, []
    for length, runs in ((6, 8), (9, 6)):
        x, shape = np.empty((1, length), np.float32), np.array([3, length], np.int64)
        for _ in range(runs):
            x[...] = rng.standard_normal(x.shape)
            (got,) = session.run(None, {"x": x, "shape": shape})
            (want,) = oracle.run(None, {"x": x, "shape": shape})
            np.testing.assert_array_equal(got, want)
        seams.append(set(reports.declines_at(rec, int(rec.steps()["step"].max()))["reason"]))
    assert len(cuts) == 2  # one per plan: the second length re-planned
    # the Neg: too short a run, then (its input's shape moved between warm-up steps) varying
    assert seams == [{"host_read", "segment_too_short"}, {"host_read", "varying_shape"}]
    assert session.executor.slot_capture("primary").all_seams


def _session():
    mlp, weights = _mlp_nodes("x", "y")
    proto = _model(mlp, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], weights)
    session = workbench.InferenceSession(proto.SerializeToString())
    x = np.ones((1, 8), np.float32)
    for _ in range(4):
        session.run(None, {"x": x})
    return session, x


def test_a_captured_graph_says_why_it_cannot_replay_and_frees_what_it_held():
    session, x = _session()
    ex = session.executor
    cap = ex.slot_capture("primary")
    assert cap.installed
    (captured,) = cap.graphs.values()
    runner = ex.capture_runner
    check = (ex.arrays, ex.state.dispatch, ex.graph, ex.state.bound_positions, runner.control_flow_outputs)
    assert captured.mismatch(*check) is None
    vid = ex.graph.by_name["x"]
    ex.arrays[vid] = np.array(x)  # the same values at another address
    assert captured.mismatch(*check) == ("binding_changed", "x address")
    ex.arrays[vid] = np.ones((2, 8), np.float32)
    reason, detail = captured.mismatch(*check)
    assert reason == "binding_changed" and detail == "x shape (1, 8) -> (2, 8)"
    cap.retire()
    assert captured.graph is None and not captured.outputs and not cap.installed
    # and the session goes on: warm-up, a new recording, replays
    for _ in range(4):
        session.run(None, {"x": x})
    assert cap.installed and cap.captures == 2

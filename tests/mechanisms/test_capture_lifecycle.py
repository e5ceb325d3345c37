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

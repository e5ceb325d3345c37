"""Binding symbols from the feeds' shapes (`SymbolBinder`, the executor's per-step
binder): inputs declared alike are read once per group, and anything unusual goes
to `bind_symbols`, so the bindings, their order and every error are as before."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor

import workbench
from workbench.errors import InputError
from workbench.executor.shapes import SymbolBinder, bind_symbols

RUNS = 8
CACHES = 6  # inputs declared alike, as a decode step's KV caches are


def _model():
    """Six caches declared [batch, 2, past, 4], a mask [batch, total] and ids
    [batch, seq]: each cache is concatenated with rows made from the ids and reduced,
    the mask summed, so every intermediate's shape follows the bound symbols."""
    nodes, outputs = [], []
    for i in range(CACHES):
        nodes += [helper.make_node("Concat", [f"cache{i}", "step_rows"], [f"grown{i}"], axis=2),
                  helper.make_node("ReduceSum", [f"grown{i}", "axis2"], [f"y{i}"], keepdims=0)]
        outputs.append(_tensor(f"y{i}", ["batch", 2, 4]))
    nodes += [helper.make_node("Cast", ["ids"], ["ids_f"], to=1),
              helper.make_node("Unsqueeze", ["ids_f", "axis2"], ["ids_col"]),
              helper.make_node("Expand", ["ids_col", "row_shape"], ["rows"]),
              helper.make_node("Unsqueeze", ["rows", "axis1"], ["rows1"]),
              helper.make_node("Concat", ["rows1", "rows1"], ["step_rows"], axis=1),
              helper.make_node("ReduceSum", ["mask", "axis1"], ["mask_sum"], keepdims=0)]
    outputs.append(_tensor("mask_sum", ["batch"]))
    inputs = [_tensor(f"cache{i}", ["batch", 2, "past", 4]) for i in range(CACHES)]
    inputs += [_tensor("mask", ["batch", "total"]), _tensor("ids", ["batch", "seq"], 7)]
    inits = [helper.make_tensor(n, 7, [1], [v]) for n, v in (("axis1", 1), ("axis2", 2))]
    inits.append(helper.make_tensor("row_shape", 7, [3], [1, 1, 4]))
    graph = helper.make_graph(nodes, "alike", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(past, seq=1, batch=1, rng=None):
    rng = rng or np.random.default_rng(0)
    feeds = {f"cache{i}": rng.standard_normal((batch, 2, past, 4)).astype(np.float32) for i in range(CACHES)}
    feeds["mask"] = rng.standard_normal((batch, past + seq)).astype(np.float32)
    feeds["ids"] = rng.integers(0, 9, (batch, seq)).astype(np.int64)
    return feeds


def test_stable_and_growing_feeds_bind_and_run_as_onnxruntime_does():
    """Runs at stable addresses with new contents (the same arrays refilled), then
    runs whose caches grow (new arrays, a new `past`): every output against
    onnxruntime, and the bindings of every run against `bind_symbols`."""
    model = _model()
    session = workbench.InferenceSession(model)
    oracle = _ort(model)
    executor = session.executor
    binder, graph = executor._binder, executor.graph
    rng = np.random.default_rng(1)
    stable = _feeds(5)
    for run in range(2 * RUNS):
        if run < RUNS:
            for name, arr in stable.items():  # same buffers, new contents
                arr[...] = _feeds(5, rng=rng)[name]
            feeds = stable
        else:
            feeds = _feeds(5 + run, rng=rng)
        by_id = {session._input_ids[n]: a for n, a in feeds.items()}
        assert list(binder.bind(by_id).items()) == list(bind_symbols(graph, by_id).items())
        got = session.run(None, feeds)
        want = oracle.run(None, {n: a.copy() for n, a in feeds.items()})
        for name, g, w in zip([o.name for o in session.get_outputs()], got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"run {run} {name}")


@pytest.mark.parametrize("case", ["one cache longer", "mask batch differs", "ids batch differs",
                                  "cache of another rank", "cache missing", "not an array"])
def test_unlike_feeds_bind_or_fail_exactly_as_bind_symbols_does(case):
    graph = workbench.InferenceSession(_model()).executor.graph
    ids = {v.name: v.id for v in (graph.values[i] for i in graph.inputs)}
    feeds = {ids[n]: a for n, a in _feeds(4, seq=2, batch=2).items()}
    if case == "one cache longer":
        feeds[ids["cache3"]] = np.zeros((2, 2, 5, 4), np.float32)
    elif case == "mask batch differs":
        feeds[ids["mask"]] = np.zeros((1, 6), np.float32)
    elif case == "ids batch differs":
        feeds[ids["ids"]] = np.zeros((3, 2), np.int64)
    elif case == "cache of another rank":
        feeds[ids["cache0"]] = np.zeros((2, 2, 4), np.float32)
    elif case == "cache missing":
        del feeds[ids["cache2"]]
    else:
        feeds[ids["cache1"]] = [[1.0]]
    binder = SymbolBinder(graph)
    try:
        expected = bind_symbols(graph, feeds)
    except InputError as error:
        with pytest.raises(InputError) as got:
            binder.bind(feeds)
        assert str(got.value) == str(error)
        assert "disagree on symbol" in str(error)
        return
    assert list(binder.bind(feeds).items()) == list(expected.items())


def _revealing_model(second: str = "k"):
    """x [6] -> Compress(x, x > 0) declared ["k"]: a result sized by values, whose size
    binds k when it comes (`Executor._adopt`); Neg of it is declared ["k"] too, so its
    buffer is sized from that binding. Compress(x, x < 0), declared ["k"] as well, is a
    second opinion of k that differs whenever the counts do."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]), helper.make_node("Less", ["x", "zero"], ["neg"]),
             helper.make_node("Compress", ["x", "pos"], ["kept"], axis=0),
             helper.make_node("Neg", ["kept"], ["y"]),
             helper.make_node("Compress", ["x", "neg"], ["dropped"], axis=0),
             helper.make_node("Abs", ["dropped"], ["z"])]
    graph = helper.make_graph(nodes, "revealed", [_tensor("x", [6])], [_tensor("y", ["k"]), _tensor("z", [second])],
                              [helper.make_tensor("zero", 1, [], [0.0])],
                              value_info=[_tensor("kept", ["k"]), _tensor("dropped", [second])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_symbols_a_result_reveals_bind_and_a_contradiction_replans_as_onnxruntime_runs():
    """One input array refilled in place, 10 runs against onnxruntime: runs with as many
    positive as negative entries agree on k (bound once, from the first Compress's
    result); the others reveal two sizes for it, which marks k untrusted and re-plans,
    and every output is onnxruntime's either way (onnxruntime is given the model with the
    second size named apart: it refuses one symbol of two sizes)."""
    session, peer = workbench.InferenceSession(_revealing_model()), _ort(_revealing_model(second="j"))
    x = np.zeros(6, np.float32)
    rows = [[1, -1, 2, -2, 3, -3], [4, 5, -6, 7, -8, -9], [-1, -2, -3, -4, 5, 6], [1, 2, 3, 4, 5, -6],
            [3, -3, 2, -2, 1, -1], [-5, 5, -5, 5, -5, 5], [1, 1, 1, -1, -1, -1], [2, 2, 2, 2, -2, -2],
            [-7, 7, -7, 7, 7, -7], [9, -9, 9, -9, 9, -9]]
    for run, row in enumerate(rows):
        x[...] = row
        for got, want in zip(session.run(None, {"x": x}), peer.run(None, {"x": x.copy()})):
            np.testing.assert_array_equal(got, want, err_msg=f"run {run}")
    executor = session.executor
    assert "k" in executor._untrusted  # runs 1, 3 and 7 saw two sizes for it
    kept = next(v.id for v in executor.graph.values if v.name == "kept")
    assert executor._revealed[kept] == ((0, "k"),)  # the declared dims a result reveals, read once

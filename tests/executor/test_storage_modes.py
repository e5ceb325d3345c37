"""Views, in-place compute and dead-value release never change a result.

Each mode is compared bit for bit with the default (views on, in place on, release
off) on the whole ONNX node test suite and on 64-token decodes of every built-in model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conformance import node_cases, to_python
from onnx import TensorProto, helper

import workbench
from workbench import Generator, SessionOptions, models

MODES = {
    "views off": SessionOptions(views=False),
    "in-place off": SessionOptions(compute_in_place=False),
    "release on": SessionOptions(release_dead_values=True),
    "all off, release on": SessionOptions(views=False, compute_in_place=False, release_dead_values=True),
}


def _same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return np.array_equal(a, b) if a.dtype.hasobject else a.tobytes() == b.tobytes()  # bit for bit


def _outputs(model, feeds, options):
    session = workbench.InferenceSession(model, options=SessionOptions(**{**vars(options), "trace": False}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # twice: the second run reuses buffers, where stale-storage bugs show
        first = [session.run(None, f) for f in feeds]
        return first, [session.run(None, f) for f in feeds]


@pytest.mark.parametrize("mode", list(MODES))
def test_conformance_suite_identical_in_every_mode(mode):
    differing = []
    for case in node_cases():
        if "bernoulli" in case.name:
            continue  # draws random numbers
        graph = case.model.graph
        inits = {t.name for t in graph.initializer}
        names = [i.name for i in graph.input if i.name not in inits]
        feeds = [dict(zip(names, (to_python(x) for x in inputs))) for inputs, _ in case.data_sets]
        try:
            base = _outputs(case.model, feeds, SessionOptions())
        except workbench.WorkbenchError:
            continue  # a case the default mode fails is covered by test_conformance
        got = _outputs(case.model, feeds, MODES[mode])
        if not all(_same(x, y) for run_a, run_b in zip(base, got) for a, b in zip(run_a, run_b)
                   for x, y in zip(a, b)):
            differing.append(case.name)
    assert not differing, f"{mode}: {len(differing)} cases differ: {differing[:10]}"


DECODERS = {
    "gpt2": lambda: models.gpt2("tiny"),
    "llama-onnx": lambda: models.llama("tiny", flavor="onnx"),
    "llama-genai": lambda: models.llama("tiny", flavor="genai"),
    "phi3": lambda: models.phi3("tiny"),
}


@pytest.mark.parametrize("name", list(DECODERS))
def test_decode_token_exact_in_every_mode(name):
    data = DECODERS[name]().SerializeToString()
    prompt = [(5 * i + 3) % 200 + 3 for i in range(20)]
    base = Generator(workbench.InferenceSession(data)).generate(prompt, 64, progress=False, eos_token_id=-1)
    for mode, options in MODES.items():
        for kv in ("growing", "fixed"):
            got = Generator(workbench.InferenceSession(data, options=options)).generate(
                prompt, 64, kv=kv, progress=False, eos_token_id=-1)
            assert got.tokens == base.tokens, (mode, kv)


# -- a view never outlives or is corrupted by its source -------------------------------


def _view_then_overwrite_model():
    """r = Reshape(x*2); y = Add(x*2, 1) could be written in place into x*2's buffer,
    which r still views: the view must pin it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    out_r = helper.make_tensor_value_info("r_out", TensorProto.FLOAT, [3, 2])
    out_y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, 2])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Reshape", ["sq", "shape"], ["r"]),
        helper.make_node("Add", ["sq", "one"], ["y"]),   # last reader of sq: in-place candidate
        helper.make_node("Neg", ["r"], ["r_neg"]),       # the view is read after the Add
        helper.make_node("Neg", ["r_neg"], ["r_out"]),
    ]
    graph = helper.make_graph(nodes, "pin", [x], [out_r, out_y], [shape, one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["default", *MODES])
def test_view_source_is_never_overwritten_or_released_early(mode):
    options = SessionOptions() if mode == "default" else MODES[mode]
    session = workbench.InferenceSession(_view_then_overwrite_model(), options=options)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(2):
        r_out, y = session.run(None, {"x": x})
        np.testing.assert_array_equal(r_out, (x * x).reshape(3, 2))
        np.testing.assert_array_equal(y, x * x + 1)
    sp = session.executor.state.storage
    sq = session.graph.by_name["sq"]
    if options.views:
        assert sq in sp.pinned_from, "the view must pin its source"
        assert sp.storage[session.graph.by_name["y"]] != "alias", "a pinned buffer must not be overwritten"


def test_in_place_happens_when_safe():
    session = workbench.InferenceSession(_view_then_overwrite_model())
    session.run(None, {"x": np.ones((2, 3), np.float32)})
    sp = session.executor.state.storage
    r_neg = session.graph.by_name["r_neg"]
    # Neg(r) cannot overwrite the view r, but Neg(r_neg) -> r_out is an output: no alias either
    assert sp.storage[r_neg] == "owner"
    chain = _chain_model()
    s2 = workbench.InferenceSession(chain)
    s2.run(None, {"x": np.ones(4, np.float32)})
    kinds = {s2.graph.values[v].name: k for v, k in s2.executor.state.storage.storage.items()}
    assert kinds["b"] == "alias" and kinds["c"] == "alias"  # a = Exp(x); b = Neg(a); c = Tanh(b)
    np.testing.assert_allclose(s2.run(None, {"x": np.ones(4, np.float32)})[0],
                               np.sin(np.tanh(-np.exp(np.ones(4, np.float32)))), rtol=1e-6)


def _chain_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Sin", ["c"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "chain", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("capture", [False, True])
def test_each_eager_step_records_the_in_place_writes_of_the_storage_plan_vs_onnxruntime(capture):
    """Exp -> Neg -> Tanh -> Sin: Neg and Tanh write in place of their inputs. Each
    eager step records exactly those two aliases (the dispatch keeps the pairs from
    the storage plan), and each of 8 runs on one input buffer with new contents
    agrees with onnxruntime."""
    from oracles import ort_session, runs_on_one_buffer

    model = _chain_model()
    session = workbench.InferenceSession(model, SessionOptions(capture=capture))
    names = {v.id: v.name for v in session.graph.values}
    for run, _, got, want in runs_on_one_buffer(session, ort_session(model), (4,), 8, np.random.default_rng(2)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"run {run}")
    rec = session.recording
    aliases = rec.aliases()
    eager = set(rec.node_timings().query("mode == 'eager'").step)
    assert eager and (capture or len(eager) == 8)
    for step in eager:
        pairs = {(names[a.value_id], names[a.into_id]) for a in aliases[aliases.step == step].itertuples()}
        assert pairs == {("b", "a"), ("c", "b")}, f"step {step}"

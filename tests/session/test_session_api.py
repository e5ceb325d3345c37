"""The onnxruntime-shaped API, model sources, functions and subgraphs, compared with onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import workbench


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    n = helper.make_tensor_value_info("n", TensorProto.INT64, None)
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["y"], keepdims=0),
        helper.make_node("Shape", ["ids"], ["n"]),
    ]
    graph = helper.make_graph(nodes, "api", [x, ids], [y, n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ort(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_inputs_and_outputs_described_like_onnxruntime():
    model = _model()
    ours, theirs = workbench.InferenceSession(model), _ort(model)
    for mine, peer in zip(ours.get_inputs(), theirs.get_inputs()):
        assert (mine.name, mine.shape, mine.type) == (peer.name, peer.shape, peer.type)
    assert [o.name for o in ours.get_outputs()] == ["y", "n"]
    assert [o.type for o in ours.get_outputs()] == ["tensor(float)", "tensor(int64)"]


def test_input_and_output_descriptions_are_made_once_and_cannot_be_edited_through():
    """A decode loop asks for `get_outputs()` every step: the NodeArgs are made once per
    session (onnxruntime's too), in a new list each call, and `shape` is a new list at
    each read, so a caller editing one changes nothing the session reports later."""
    ours = workbench.InferenceSession(_model())
    first, second = ours.get_inputs(), ours.get_inputs()
    assert first is not second and all(a is b for a, b in zip(first, second))
    first.clear()
    assert [i.name for i in ours.get_inputs()] == ["x", "ids"]
    shape = ours.get_inputs()[0].shape
    shape[0] = 99
    assert ours.get_inputs()[0].shape == ["batch", 3]
    assert ours.get_outputs()[0] == workbench.NodeArg("y", [], "tensor(float)") != workbench.NodeArg("y", None, "x")
    assert repr(ours.get_inputs()[1]) == "NodeArg(name='ids', shape=['batch'], type='tensor(int64)')"


@pytest.mark.parametrize("source", ["proto", "bytes", "str", "pathlike"])
def test_every_model_source(tmp_path, source):
    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    arg = {"proto": model, "bytes": model.SerializeToString(), "str": str(path), "pathlike": Path(path)}[source]
    feed = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32),
            "ids": np.array([4, 5], np.int64)}
    got = workbench.InferenceSession(arg).run(None, feed)
    want = _ort(model).run(None, feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


def test_output_selection_and_independent_results():
    session = workbench.InferenceSession(_model())
    feed = {"x": np.ones((1, 3), np.float32), "ids": np.array([1], np.int64)}
    (n,) = session.run(["n"], feed)
    first = session.run(None, feed)[0]
    session.run(None, {"x": np.zeros((1, 3), np.float32), "ids": np.array([1], np.int64)})
    assert n.tolist() == [1]
    assert float(first) == pytest.approx(3 * np.tanh(1.0), rel=1e-6), "results must not alias reused buffers"


def test_symbolic_batch_changes_between_runs():
    session = workbench.InferenceSession(_model())
    for batch in (1, 4, 2):
        x = np.full((batch, 3), 0.5, np.float32)
        y, n = session.run(None, {"x": x, "ids": np.arange(batch, dtype=np.int64)})
        assert n.tolist() == [batch]
        assert float(y) == pytest.approx(batch * 3 * np.tanh(0.5), rel=1e-5)


def test_model_local_functions_are_inlined():
    fn = helper.make_function(
        "local", "AddMul", ["a", "b"], ["c"],
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["c"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("AddMul", ["x", "x"], ["y"], domain="local")], "f", [x], [y])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    session = workbench.InferenceSession(model)
    assert {p.node.op_type for p in session.plan.nodes} == {"Add", "Mul"}
    (y,) = session.run(None, {"x": np.array([1, 2, 3], np.float32)})
    np.testing.assert_array_equal(y, [2, 8, 18])


def _if_with_outer_capture() -> onnx.ModelProto:
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    then_g = helper.make_graph([helper.make_node("Mul", ["x2", "x"], ["r"])], "then", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["r2"])], "else", [],
                               [helper.make_tensor_value_info("r2", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Add", ["x", "x"], ["x2"]),
             helper.make_node("If", ["cond"], ["out"], then_branch=then_g, else_branch=else_g)]
    return helper.make_model(helper.make_graph(nodes, "if", [cond, x], [out]),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("flag", [True, False])
def test_if_reads_outer_scope_values(flag):
    model = _if_with_outer_capture()
    session = workbench.InferenceSession(model)
    if_node = next(p for p in session.plan.nodes if p.node.op_type == "If")
    assert sorted(session.graph.values[c].name for c in if_node.node.outer_reads) == ["x", "x2"]
    assert if_node.kernel_kind == "native" and not if_node.capture.supported
    assert if_node.capture.reason == "control_flow"
    feed = {"cond": np.array(flag), "x": np.array([1.5, -2.0], np.float32)}
    np.testing.assert_allclose(session.run(None, feed)[0], _ort(model).run(None, feed)[0])


def test_fallback_nodes_are_reported():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], name="pool")
    model = helper.make_model(helper.make_graph([node], "p", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    session = workbench.InferenceSession(model)
    assert session.fallback_nodes() == [("pool", "", "MaxPool")]
    (p,) = session.plan.nodes
    assert p.capture.reason == "host_fallback_kernel"
    feed = {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)}
    np.testing.assert_array_equal(session.run(None, feed)[0], _ort(model).run(None, feed)[0])


def test_cuda_backend_without_gpu_is_a_clear_error(monkeypatch):
    try:
        import cupy
        if cupy.cuda.is_available():
            pytest.skip("a GPU is present")
    except ImportError:
        monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(workbench.BackendUnavailableError, match="cuda"):
        workbench.InferenceSession(_model(), backend="cuda")


def test_new_recording_starts_a_fresh_run_and_keeps_the_old_one():
    from workbench import Generator, models

    session = workbench.InferenceSession(models.llama("tiny", flavor="onnx"))
    Generator(session).generate([3, 4, 5], 4, progress=False, eos_token_id=-1)
    first = session.recording
    steps = len(first)
    fresh = session.new_recording()
    assert fresh is session.recording is session.executor.recording and fresh is not first
    assert len(fresh) == 0 and len(fresh.nodes()) == len(first.nodes())
    assert fresh.rewrites().rule.tolist() == first.rewrites().rule.tolist()
    Generator(session).generate([3, 4, 5], 4, progress=False, eos_token_id=-1)
    assert len(first) == steps and len(fresh) == 4


def test_stop_recording_runs_untraced_and_decodes_like_onnxruntime():
    from workbench import Generator, models

    model = models.llama("tiny", flavor="onnx")
    session = workbench.InferenceSession(model)
    expected = Generator(_ort(model)).generate([3, 4, 5], 6, progress=False, eos_token_id=-1).tokens
    traced = session.recording
    assert Generator(session).generate([3, 4, 5], 6, progress=False, eos_token_id=-1).tokens == expected
    steps = len(traced)
    assert session.stop_recording() is traced
    assert session.recording is None and session.executor.recording is None
    assert Generator(session).generate([3, 4, 5], 6, progress=False, eos_token_id=-1).tokens == expected
    assert len(traced) == steps  # nothing more was written into it
    fresh = session.new_recording()
    assert Generator(session).generate([3, 4, 5], 6, progress=False, eos_token_id=-1).tokens == expected
    assert len(fresh) == 6 and len(traced) == steps

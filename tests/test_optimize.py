"""Load-time rewrites: constant folding, dead nodes, unused weights — each recorded,
none changing a value (checked against onnxruntime over runs at stable addresses)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import SessionOptions

RUNS = 8


def _tied_embedding_model(vocab=64, hidden=16):
    """Tied embeddings as genai exports write them: the table is Transpose(lm_head)."""
    rng = np.random.default_rng(0)
    lm_head = numpy_helper.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "lm_head")
    unused = numpy_helper.from_array(np.ones((4, 4), np.float32), "unused_weight")
    nodes = [
        helper.make_node("Transpose", ["lm_head"], ["table"], perm=[1, 0], name="tie/Transpose"),
        helper.make_node("Gather", ["table", "ids"], ["h"], name="embed/Gather"),
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32)),
                         name="two/Constant"),
        helper.make_node("Mul", ["h", "two"], ["h2"], name="scale/Mul"),
        helper.make_node("MatMul", ["h2", "lm_head"], ["logits"], name="lm_head/MatMul"),
        helper.make_node("Neg", ["h2"], ["nobody_reads_me"], name="dead/Neg"),
    ]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "s"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s", vocab])],
                              [lm_head, unused])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("level", ["all", "basic", "disabled"])
def test_rewrites_are_recorded_and_change_no_value(level):
    model = _tied_embedding_model()
    session = workbench.InferenceSession(
        model, SessionOptions(graph_optimization_level=level, decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(1)
    ids = np.empty((1, 5), np.int64)
    for run in range(RUNS):
        ids[...] = rng.integers(0, 64, ids.shape)
        (got,) = session.run(None, {"ids": ids})
        (want,) = oracle.run(None, {"ids": ids.copy()})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    rewrites = session.recording.rewrites()
    if level == "disabled":
        assert rewrites.empty and len(session.graph.nodes) == 6
        return
    by_rule = rewrites.groupby("rule").original_nodes.sum().to_dict()
    assert sorted(by_rule["constant_folding"]) == ["tie/Transpose", "two/Constant"]
    assert by_rule["dead_node"] == ["dead/Neg"]
    unused = rewrites[rewrites.rule == "unused_initializer"]
    assert set(unused.result) == {"unused_weight"} and (unused.bytes_delta < 0).all()
    folded = rewrites[rewrites.original_nodes.map(lambda n: n == ["tie/Transpose"])].iloc[0]
    assert folded.result == "table" and folded.bytes_delta == 64 * 16 * 4
    table = session.graph.initializers[session.graph.by_name["table"]]
    assert table.flags.c_contiguous, "the Gather reads a contiguous table, not a strided view"
    assert session.graph.initializers[session.graph.by_name["two"]].shape == (), "a scalar stays 0-d"
    assert [n.op_type for n in session.graph.nodes] == ["Gather", "Mul", "MatMul"]
    assert len(session.loaded_graph.nodes) == 6, "the loaded graph is left as it was"


def test_rewrites_survive_save_and_load(tmp_path):
    session = workbench.InferenceSession(_tied_embedding_model())
    session.run(None, {"ids": np.zeros((1, 3), np.int64)})
    session.recording.save(tmp_path / "rec")
    loaded = workbench.Recording.load(tmp_path / "rec")
    assert loaded.rewrites().rule.tolist() == session.recording.rewrites().rule.tolist()


def test_folding_never_inflates_a_small_constant_into_a_big_tensor():
    shape = numpy_helper.from_array(np.array([512, 512], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
             helper.make_node("Add", ["zeros", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 512])], [shape])
    session = workbench.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert session.recording.rewrites().empty, "a 1 MiB tensor from 16 bytes stays a run-time node"


def test_an_unknown_level_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="graph_optimization_level must be one of"):
        SessionOptions(graph_optimization_level="aggressive")
    monkeypatch.setenv("WORKBENCH_GRAPH_OPTIMIZATION", "disabled")
    assert SessionOptions().graph_optimization_level == "disabled"


def test_genai_tied_embeddings_fold_and_decode_token_exact():
    from workbench import Generator, models
    from workbench.models.exports import tied_embeddings

    data = tied_embeddings(models.llama("tiny", flavor="genai")).SerializeToString()
    session = workbench.InferenceSession(data, SessionOptions(shadow="raise", decode_memo_verify=False))
    assert session.recording.rewrites().original_nodes.tolist() == [["/model/embed_tokens/tied/Transpose"]]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    for kv in ("growing", "fixed"):
        a = Generator(session).generate(list(range(3, 11)), 16, progress=False, eos_token_id=-1, kv=kv)
        b = Generator(peer).generate(list(range(3, 11)), 16, progress=False, eos_token_id=-1, kv=kv)
        assert a.tokens == b.tokens

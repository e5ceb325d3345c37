"""Load-time rewrites: constant folding, dead nodes, unused weights — each recorded,
none changing a value (checked against onnxruntime over runs at stable addresses)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session as _ort

import workbench
from workbench import SessionOptions
from workbench.executor.memo import SHAPE_ARITHMETIC, SHAPE_SOURCES

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
    rewrites = session.recording.rewrites()
    folded = rewrites[rewrites.rule == "constant_folding"]
    assert folded.original_nodes.tolist() == [["/model/embed_tokens/tied/Transpose"]]
    relaid = rewrites[rewrites.rule == "matvec_layout"]
    assert "lm_head.MatMul.weight" in set(relaid.result), "the tied weight, now read by MatMul only"
    weight = session.graph.initializers[session.graph.by_name["lm_head.MatMul.weight"]]
    assert weight.flags.f_contiguous
    so = ort.SessionOptions()
    so.log_severity_level = 3
    peer = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    for kv in ("growing", "fixed"):
        a = Generator(session).generate(list(range(3, 11)), 16, progress=False, eos_token_id=-1, kv=kv)
        b = Generator(peer).generate(list(range(3, 11)), 16, progress=False, eos_token_id=-1, kv=kv)
        assert a.tokens == b.tokens


def test_tied_embeddings_saved_from_an_external_data_file_decode_token_exact(tmp_path):
    """`save_tied_embeddings` (benchmarks' SmolLM2 tied row): read with its external
    data, tied, written with external data again; both runtimes decode it alike."""
    import onnx

    from workbench import Generator, models
    from workbench.models.exports import save_tied_embeddings

    source = tmp_path / "source"
    source.mkdir()
    onnx.save_model(models.llama("tiny", flavor="genai"), str(source / "model.onnx"), save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    (tmp_path / "tied").mkdir()
    path = save_tied_embeddings(source / "model.onnx", tmp_path / "tied")
    assert path == tmp_path / "tied" / "model.onnx" and (tmp_path / "tied" / "model.onnx.data").is_file()
    saved = onnx.load(str(path), load_external_data=False)
    assert "model.embed_tokens.weight" not in {t.name for t in saved.graph.initializer}
    weights = {t.name: t for t in saved.graph.initializer}
    assert weights["lm_head.MatMul.weight"].data_location == onnx.TensorProto.EXTERNAL
    session = workbench.InferenceSession(str(path))
    assert "constant_folding" in set(session.recording.rewrites().rule)
    peer = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for kv in ("growing", "fixed"):
        a = Generator(session).generate(list(range(3, 11)), 12, progress=False, eos_token_id=-1, kv=kv)
        b = Generator(peer).generate(list(range(3, 11)), 12, progress=False, eos_token_id=-1, kv=kv)
        assert a.tokens == b.tokens


# -- shape arithmetic folding (graph_optimization_level extended / all) -------------------


def _onnx_llama_session(**options):
    from workbench import models

    options.setdefault("decode_memo_verify", False)
    return workbench.InferenceSession(models.llama("tiny", flavor="onnx").SerializeToString(),
                                      SessionOptions(**options))


def _decode(session, on_token=None, tokens=16):
    from workbench import Generator

    return Generator(session).generate(list(range(3, 11)), tokens, progress=False, eos_token_id=-1,
                                       on_token=on_token)


def test_shape_arithmetic_is_folded_on_replays_token_exact():
    from workbench import Generator, models

    session = _onnx_llama_session(shadow="raise")
    got = _decode(session)
    data = models.llama("tiny", flavor="onnx").SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = Generator(ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])).generate(
        list(range(3, 11)), 16, progress=False, eos_token_id=-1)
    assert got.tokens == want.tokens
    stats = session.memo_stats()
    assert stats["shape_folded"] >= 10 * (stats["replayed"] - 1), "a dozen or more nodes a replayed step"
    fold = session.executor.state.shape_fold
    ops = {session.plan.nodes[k].node.op_type for k in fold.nodes}
    assert "Shape" in ops and ops <= SHAPE_SOURCES | SHAPE_ARITHMETIC
    timings = session.recording.node_timings()
    folded = timings[timings.node.isin({session.plan.nodes[k].node.name for k in fold.nodes})]
    # a folded node is reinstated (elided) where it runs eagerly, replayed inside a captured segment
    assert folded["mode"].isin(["elided", "replayed"]).sum() >= stats["shape_folded"]
    basic = _onnx_llama_session(graph_optimization_level="basic")
    _decode(basic)
    assert basic.memo_stats()["shape_folded"] == 0, "basic folds constants only"


def test_shape_folding_trusts_only_what_it_saw_the_kernels_compute():
    session = _onnx_llama_session()
    state = session.executor.state

    def corrupt_before_validation(_):
        fold = state.shape_fold
        if fold is not None and not fold.validated and not getattr(fold, "_poked", False):
            vid = next(iter(fold.values))
            fold.values[vid] = fold.values[vid] + 1  # a reference value the kernels will disagree with
            fold._poked = True

    _decode(session, on_token=corrupt_before_validation)
    assert session.memo_stats()["shape_folded"] == 0, "disagreement at validation: never served"


def _shape_value_model():
    """A fixed-shape input whose Shape flows into values (not shapes), plus a growing
    KV-like input so the memo replays."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="x/Shape"),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="x/Shape/Cast"),
             helper.make_node("Add", ["sf", "z"], ["y"], name="use/Add"),
             helper.make_node("Concat", ["past", "row"], ["present"], axis=1, name="kv/Concat")]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "T", 2]),
        helper.make_tensor_value_info("row", TensorProto.FLOAT, [1, 1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, "T1", 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shadow_names_shape_folding_when_a_served_value_is_wrong():
    model = _shape_value_model()
    session = workbench.InferenceSession(model, SessionOptions(shadow="record", capture=False,
                                                               decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(2)
    x, z, row = np.empty((2, 3), np.float32), np.empty(2, np.float32), np.empty((1, 1, 2), np.float32)
    past = np.zeros((1, 0, 2), np.float32)
    poked = False
    for run in range(RUNS):
        for a in (x, z, row):
            a[...] = rng.standard_normal(a.shape)
        fold = session.executor.state.shape_fold
        if fold is not None and fold.validated and not poked:
            (stored,) = [v for o, v in fold.values.items() if session.graph.values[o].name == "s"]
            stored[...] = [5, 5]  # the served value is now wrong
            poked = True
        got = session.run(None, {"x": x, "z": z, "past": past, "row": row})
        want = oracle.run(None, {"x": x.copy(), "z": z.copy(), "past": past.copy(), "row": row.copy()})
        if not poked:
            np.testing.assert_allclose(got[0], want[0], err_msg=f"run {run}")
        past = got[1]
    assert poked
    divergences = session.recording.divergences()
    first = divergences.sort_values(["step", "plan_index"]).iloc[0]
    assert (first.node, first.mechanism) == ("x/Shape", "shape_fold")


def test_matvec_layout_only_for_weights_matmul_alone_reads_as_b():
    rng = np.random.default_rng(3)
    w_mm = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w_mm")
    w_shared = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w_shared")
    nodes = [helper.make_node("MatMul", ["x", "w_mm"], ["a"], name="mm"),
             helper.make_node("MatMul", ["x", "w_shared"], ["b"], name="mm2"),
             helper.make_node("Gather", ["w_shared", "ids"], ["g"], name="gather"),
             helper.make_node("ReduceSum", ["g"], ["gs"], keepdims=0, name="rs")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 6]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("gs", TensorProto.FLOAT, [])], [w_mm, w_shared])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    rewrites = session.recording.rewrites()
    assert rewrites[rewrites.rule == "matvec_layout"].result.tolist() == ["w_mm"]
    oracle = _ort(model)
    x, ids = np.empty((1, 8), np.float32), np.empty(2, np.int64)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        ids[...] = rng.integers(0, 8, 2)
        outputs = zip(session.run(None, {"x": x, "ids": ids}), oracle.run(None, {"x": x.copy(), "ids": ids.copy()}))
        for got, want in outputs:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    extended = workbench.InferenceSession(model, SessionOptions(graph_optimization_level="extended"))
    assert "matvec_layout" not in set(extended.recording.rewrites().rule)

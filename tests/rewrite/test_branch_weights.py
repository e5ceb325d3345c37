"""If branches as optimum's merged decoder has them (its weights in the outer graph, its
model in both branches of one If): the weight rules inside them
(`rewrite/branch_weights.py`) and the decode-plan memo running them
(`Executor._subgraph_runner`, reusable).

Hoisting those weights into the branches and fusing, padding and relaying them there
changes where the bytes live and how products are grouped, never a value: checked
against onnxruntime run after run on one input buffer with the branch switching, by
the merged llama's tokens and logits, and by what the rewritten branches hold (the two
share every rewritten weight; the outer originals are gone)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import ort_session, tensor

import workbench
from workbench import Generator, SessionOptions, models
from workbench.rewrite.matvec_threads import openblas_threads_available

RUNS = 8
HIDDEN = 576


def _branch(suffix: str, activation: str) -> object:
    """Q/K/V-like siblings over x (fused), an up projection (wide) then a down one
    (tall, relaid), and the square 576x576 (padded for threads)."""
    s = suffix
    nodes = [helper.make_node("MatMul", ["x", "w_q"], [f"q{s}"]),
             helper.make_node("MatMul", ["x", "w_k"], [f"k{s}"]),
             helper.make_node("MatMul", ["x", "w_v"], [f"v{s}"]),
             helper.make_node("Concat", [f"q{s}", f"k{s}", f"v{s}"], [f"qkv{s}"], axis=-1),
             helper.make_node("MatMul", ["x", "w_up"], [f"up{s}"]),
             helper.make_node(activation, [f"up{s}"], [f"act{s}"]),
             helper.make_node("MatMul", [f"act{s}", "w_down"], [f"down{s}"]),
             helper.make_node("MatMul", [f"down{s}", "w_o"], [f"out{s}"])]
    return helper.make_graph(nodes, f"branch{s}", [],
                             [tensor(f"qkv{s}", [1, 1, HIDDEN + 384]), tensor(f"out{s}", [1, 1, HIDDEN])])


def _merged_model():
    rng = np.random.default_rng(11)
    shapes = {"w_q": (HIDDEN, HIDDEN), "w_k": (HIDDEN, 192), "w_v": (HIDDEN, 192), "w_up": (HIDDEN, 1536),
              "w_down": (1536, HIDDEN), "w_o": (HIDDEN, HIDDEN)}
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)
               for name, shape in shapes.items()]
    node = helper.make_node("If", ["cond"], ["qkv", "out"], name="merged::if",
                            then_branch=_branch("_with_past", "Relu"), else_branch=_branch("_no_past", "Sigmoid"))
    graph = helper.make_graph([node], "merged", [tensor("x", [1, 1, HIDDEN]), tensor("cond", [], TensorProto.BOOL)],
                              [tensor("qkv", [1, 1, HIDDEN + 384]), tensor("out", [1, 1, HIDDEN])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("level", ["extended", "all"])
def test_branch_weights_compute_what_onnxruntime_does_run_after_run(level):
    model = _merged_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False,
                                                               graph_optimization_level=level))
    rules = set(session.recording.rewrites().rule)
    expected = {"matmul_siblings", "matvec_layout"} if level == "all" else {"matmul_siblings"}
    if level == "all" and openblas_threads_available():
        expected.add("matvec_threads")
    assert expected <= rules, rules
    oracle = ort_session(model)
    rng = np.random.default_rng(12)
    x, cond = np.empty((1, 1, HIDDEN), np.float32), np.empty((), np.bool_)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        cond[...] = run % 3 != 2  # both branches, each several times, on the same buffers
        got = session.run(None, {"x": x, "cond": cond})
        want = oracle.run(None, {"x": x.copy(), "cond": cond.copy()})
        for name, g, w in zip(("qkv", "out"), got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=f"run {run} ({bool(cond)}): {name}")


def test_the_branches_share_each_rewritten_weight_and_the_outer_originals_go():
    session = workbench.InferenceSession(_merged_model(), SessionOptions(decode_memo_verify=False))
    graph = session.graph
    node = next(n for n in graph.nodes if n.op_type == "If")
    then, other = node.subgraphs["then_branch"], node.subgraphs["else_branch"]
    assert not graph.initializers, "every weight moved into the branches"
    assert [graph.values[v].name for v in node.outer_reads] == ["x"], "the If captures only the input now"
    by_name = {name: then.initializers[vid] for name, vid in then.by_name.items() if vid in then.initializers}
    other_by_name = {name: other.initializers[vid] for name, vid in other.by_name.items() if vid in other.initializers}
    fused = [name for name in by_name if name.endswith("/siblings")]
    assert fused, sorted(by_name)
    big = [name for name, a in by_name.items() if a.ndim == 2 and a.size >= HIDDEN * 192]
    assert all(by_name[name] is other_by_name[name] for name in big), "one array for both branches"
    assert by_name[fused[0]].flags.f_contiguous and by_name["w_down"].flags.f_contiguous
    padded = session.recording.rewrites().query("rule == 'matvec_threads'")
    if openblas_threads_available():
        assert len(padded) == 2 and sorted(padded.bytes_delta > 0) == [False, True], "shared padding counted once"


@pytest.mark.parametrize("kv", ["growing", "fixed"])
def test_optimum_merged_llama_decodes_what_onnxruntime_does(kv):
    """The merged decoder's tokens and every step's logits, its weights rewritten in
    its branches: the first run takes the no-past branch, the rest the other."""
    model = models.llama("tiny", flavor="onnx", export="optimum-merged", hidden=576, heads=9, kv_heads=3,
                         head_dim=64, ffn=1536, num_layers=2, vocab=512)
    session = workbench.InferenceSession(model.SerializeToString())
    rewrites = session.recording.rewrites()
    assert len(rewrites.query("rule == 'matmul_siblings'")) == 2 * 2 * 2, "Q/K/V and gate/up, 2 layers, 2 branches"
    want = Generator(ort_session(model)).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv=kv,
                                                  return_logits=True)
    got = Generator(session).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv=kv,
                                      return_logits=True)
    assert got.tokens == want.tokens
    for step, (g, w) in enumerate(zip(got.logits, want.logits, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")


def _echo_model():
    """If(cond) whose branches return the input itself, a product of it and a running
    sum: outputs that are the caller's bytes, a branch's own buffer, and one a later
    run of the same branch rewrites."""
    rng = np.random.default_rng(13)
    w = numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.1).astype(np.float32), "w")

    def branch(s, act):
        return helper.make_graph(
            [helper.make_node("Identity", ["x"], [f"same{s}"]),
             helper.make_node("MatMul", ["x", "w"], [f"p{s}"]),
             helper.make_node(act, [f"p{s}"], [f"y{s}"])],
            f"echo{s}", [], [tensor(f"same{s}", [1, 64]), tensor(f"y{s}", [1, 32])])

    node = helper.make_node("If", ["cond"], ["same", "y"], then_branch=branch("_t", "Relu"),
                            else_branch=branch("_e", "Tanh"))
    graph = helper.make_graph([node], "echo", [tensor("x", [1, 64]), tensor("cond", [], TensorProto.BOOL)],
                              [tensor("same", [1, 64]), tensor("y", [1, 32])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_what_a_branch_handed_out_survives_its_next_runs():
    """A branch reuses its buffers run after run (the decode-plan memo inside it); what
    the caller got from earlier runs stays onnxruntime's, its input buffer reused too."""
    model = _echo_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=True))
    oracle = ort_session(model)
    rng = np.random.default_rng(14)
    x, cond = np.empty((1, 64), np.float32), np.empty((), np.bool_)
    kept = []
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        cond[...] = run % 4 != 3
        got = session.run(None, {"x": x, "cond": cond})
        kept.append((got, oracle.run(None, {"x": x.copy(), "cond": cond.copy()})))
    x[...] = np.nan  # the caller reuses its input buffer
    for run, (got, want) in enumerate(kept):
        for name, g, w in zip(("same", "y"), got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"run {run}: {name}")


def _if_in_a_loop_model():
    """Loop (4 iterations) whose body runs an If; the If's output is carried and also
    collected every iteration (a scan output keeps each iteration's array)."""
    rng = np.random.default_rng(15)
    w = numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.2).astype(np.float32), "w")

    def branch(s, act):
        return helper.make_graph(
            [helper.make_node("MatMul", ["v", "w"], [f"p{s}"]), helper.make_node(act, [f"p{s}"], [f"n{s}"])],
            f"step{s}", [], [tensor(f"n{s}", [1, 64])])

    body = helper.make_graph(
        [helper.make_node("If", ["flag"], ["v_next"], then_branch=branch("_t", "Tanh"),
                          else_branch=branch("_e", "Sigmoid")),
         helper.make_node("Identity", ["keep_going"], ["keep_going_out"]),
         helper.make_node("Identity", ["v_next"], ["v_seen"])],
        "body", [tensor("i", [], TensorProto.INT64), tensor("keep_going", [], TensorProto.BOOL), tensor("v", [1, 64])],
        [tensor("keep_going_out", [], TensorProto.BOOL), tensor("v_next", [1, 64]), tensor("v_seen", [1, 64])])
    loop = helper.make_node("Loop", ["trips", "", "x"], ["v_last", "v_all"], body=body)
    graph = helper.make_graph([loop], "looped", [tensor("x", [1, 64]), tensor("flag", [], TensorProto.BOOL),
                                                 tensor("trips", [], TensorProto.INT64)],
                              [tensor("v_last", [1, 64]), tensor("v_all", [4, 1, 64])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_branch_run_in_every_loop_iteration_hands_out_arrays_of_their_own():
    """The Loop keeps each iteration's If output. An If inside a Loop body keeps fresh
    arrays (no memo); were its branch to reuse its buffers and hand them out, every kept
    iteration would read as the last one."""
    model = _if_in_a_loop_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = ort_session(model)
    rng = np.random.default_rng(16)
    x, flag, trips = np.empty((1, 64), np.float32), np.empty((), np.bool_), np.array(4, np.int64)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        flag[...] = run % 3 != 1
        got = session.run(None, {"x": x, "flag": flag, "trips": trips})
        want = oracle.run(None, {"x": x.copy(), "flag": flag.copy(), "trips": trips})
        assert not np.allclose(got[1][0], got[1][-1]), "iterations differ"
        for name, g, w in zip(("v_last", "v_all"), got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"run {run}: {name}")


def _misdeclared_model():
    """A branch reads two outer values the model's value_info declares with one symbol
    'n' though they differ in length (onnxruntime runs it; binding 'n' from both cannot)."""
    then = helper.make_graph(
        [helper.make_node("ReduceSum", ["a"], ["sa"], keepdims=0), helper.make_node("ReduceSum", ["b"], ["sb"], keepdims=0),
         helper.make_node("Add", ["sa", "sb"], ["t"])], "then", [], [tensor("t", [])])
    other = helper.make_graph([helper.make_node("ReduceMax", ["a"], ["e"], keepdims=0)], "else", [], [tensor("e", [])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Concat", ["x", "x"], ["b"], axis=0),
         helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
        "misdeclared", [tensor("x", ["n"]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [])],
        value_info=[tensor("a", ["n"]), tensor("b", ["n"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def test_a_branch_whose_inputs_are_misdeclared_runs_on_fresh_arrays():
    """Symbols cannot be bound from what the branch reads: it falls back to running on
    fresh arrays, as before the memo ran branches, and computes onnxruntime's values."""
    model = _misdeclared_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = ort_session(model)
    rng = np.random.default_rng(17)
    x, cond = np.empty(6, np.float32), np.empty((), np.bool_)
    for run in range(RUNS):
        x[...] = rng.standard_normal(x.shape)
        cond[...] = run % 3 != 2
        got = session.run(None, {"x": x, "cond": cond})
        want = oracle.run(None, {"x": x.copy(), "cond": cond.copy()})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, err_msg=f"run {run}")

"""Rule `huge_pages` (level "all", cpu): MatMul weights in memory backed by 2 MiB pages.

It changes where a weight's bytes live, never a value: checked against onnxruntime
run after run on one input buffer (weights embedded and from external data), by a
SmolLM2-shaped decode's tokens and logits, and by the arena's own placement rules
(a padded weight's zero columns stay never-written memory)."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from oracles import ort_session, runs_on_one_buffer, tensor
from pages import anon_huge_kib, pages_present

import workbench
import workbench.rewrite.huge_pages as huge_pages
import workbench.rewrite.optimize as optimize
from workbench import Generator, SessionOptions, models
from workbench.rewrite.huge_pages import HUGE_PAGE, WeightArena

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="anonymous maps and /proc")
RUNS = 8
needs_huge_pages = pytest.mark.skipif(not huge_pages.huge_pages_available(),
                                      reason="transparent huge pages are off on this machine")


def test_the_arena_keeps_values_and_layout():
    rng = np.random.default_rng(1)
    arena = WeightArena()
    a = rng.standard_normal((576, 960), dtype=np.float32)
    b = rng.standard_normal((1536, 576), dtype=np.float32)
    in_c, in_f = arena.copy(a, "C"), arena.copy(b, "F")
    np.testing.assert_array_equal(in_c, a)
    np.testing.assert_array_equal(in_f, b)
    assert in_c.flags.c_contiguous and in_f.flags.f_contiguous and in_f.strides == (4, 1536 * 4)
    assert arena.holds(in_c) and arena.holds(in_f) and not arena.holds(a)
    assert in_c.ctypes.data % HUGE_PAGE == 0, "a chunk's first weight starts a huge page"
    assert in_f.ctypes.data % 4096 == 0 and in_f.ctypes.data >= in_c.ctypes.data + in_c.nbytes


def test_a_zero_tail_starts_a_huge_page_that_nothing_else_writes():
    arena = WeightArena()
    before = arena.empty((576, 960), np.float32)
    before[...] = 1
    tail_bytes = 576 * 225 * 4
    wide = arena.empty((576, 801), np.float32, "F", zero_tail=tail_bytes)
    wide[:, :576] = 2
    after = arena.empty((1536, 576), np.float32)
    after[...] = 3
    tail = wide[:, 576:]
    assert tail.ctypes.data % HUGE_PAGE == 0 and tail.nbytes == tail_bytes
    assert after.ctypes.data >= tail.ctypes.data + HUGE_PAGE, "the tail's huge page is its own"
    assert not any(pages_present(tail)), "the zero tail was written: it would stream from memory"
    assert not tail.any() and (wide[:, :576] == 2).all() and (before == 1).all() and (after == 3).all()


def test_without_the_huge_zero_page_a_tail_reads_from_small_zero_pages(monkeypatch):
    monkeypatch.setattr(huge_pages, "_zero_page_on_read", lambda: False)
    arena = WeightArena()
    wide = arena.empty((576, 801), np.float32, "F", zero_tail=576 * 225 * 4)
    wide[:, :576] = 5
    assert not wide[:, 576:].any() and (wide[:, :576] == 5).all()


def test_a_weight_bigger_than_a_chunk_gets_a_chunk_of_its_own(monkeypatch):
    monkeypatch.setattr(huge_pages, "CHUNK", 4 << 20)
    arena = WeightArena()
    small = arena.copy(np.ones((512, 512), np.float32), "C")  # 1 MiB
    big = arena.copy(np.full((2048, 1024), 2.0, np.float32), "C")  # 8 MiB
    more = arena.copy(np.full((512, 512), 3.0, np.float32), "C")
    assert all(arena.holds(x) for x in (small, big, more))
    assert big.ctypes.data % HUGE_PAGE == 0 and (big == 2.0).all() and (small == 1.0).all() and (more == 3.0).all()


def test_faulting_a_weight_writes_nothing_before_it():
    """The gate faults a weight's pages before the caller writes them: one zero into
    each, never into the bytes before the weight (the end of the one before it)."""
    arena = WeightArena()
    before = arena.empty((3, 1000), np.float32)  # 12,000 bytes: the next starts mid-page
    before[...] = 7
    after = arena.empty((1024, 1024), np.float32)  # 4 MiB, over two huge page boundaries
    assert (before == 7).all(), "the gate wrote into the weight before"
    assert all(pages_present(after)[::512]), "each of its huge pages is faulted"
    assert arena.stopped is None


def test_slow_huge_page_faults_stop_the_arena(monkeypatch):
    """A window of faults under MIN_FAULT_RATE stops the arena: the weight that faulted
    them keeps its place, later ones get 4 KiB pages of their own."""
    monkeypatch.setattr(huge_pages, "MIN_FAULT_RATE", float("inf"))
    monkeypatch.setattr(huge_pages, "FAULT_WINDOW", 1 << 20)
    arena = WeightArena()
    with huge_pages.placing_weights(arena):
        first = huge_pages.new_weight((1024, 1024), np.float32)
        assert arena.holds(first) and "GB/s" in arena.stopped
        second = huge_pages.new_weight((2048, 1024), np.float32)  # 8 MiB: numpy would advise huge pages
    second[...] = 1
    assert not arena.holds(second) and anon_huge_kib(second) == 0, "the rest go to 4 KiB pages"


@needs_huge_pages
def test_weights_left_in_small_pages_by_the_gate_compute_what_onnxruntime_does(monkeypatch):
    """Gate tripped at the first weight the arena places: the later weights are written
    into 4 KiB pages, not copied in; values are onnxruntime's, run after run."""
    monkeypatch.setattr(huge_pages, "MIN_FAULT_RATE", float("inf"))
    monkeypatch.setattr(huge_pages, "FAULT_WINDOW", 1)
    source, model = _model()
    session = workbench.InferenceSession(source, SessionOptions(decode_memo_verify=False))
    placed = set(session.recording.rewrites().query("rule == 'huge_pages'").result)
    by_name = session.graph.by_name
    assert len(placed) <= 1, placed
    for name in ("w_wide", "w_tall"):
        weight = session.graph.initializers[by_name[name]]
        assert name in placed or anon_huge_kib(weight) == 0, f"{name} was placed after the gate stopped"
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 576), RUNS, np.random.default_rng(5),
                              names="hzs")
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


@pytest.mark.parametrize("shape", [(1001, 777), (17, 49152), (3, 5), (2048, 96)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_write_weight_copies_every_element_in_blocks_of_rows(shape, order):
    src = np.random.default_rng(4).standard_normal(shape, dtype=np.float32)
    dst = np.full(shape, np.nan, np.float32, order=order)
    huge_pages.write_weight(dst, src)
    np.testing.assert_array_equal(dst, src)
    wide = np.full((shape[0], shape[1] + 9), np.nan, np.float32, order=order)
    huge_pages.write_weight(wide[:, 4:4 + shape[1]], src)  # a column range, as fusion and padding write
    np.testing.assert_array_equal(wide[:, 4:4 + shape[1]], src)
    assert np.isnan(wide[:, :4]).all() and np.isnan(wide[:, 4 + shape[1]:]).all()


def test_weights_relaid_in_blocks_with_ragged_rows_compute_what_onnxruntime_does():
    """Weights whose row counts no block divides, fused (Q/K/V-like siblings), padded and
    relaid column-major at load; onnxruntime's values over runs on one input buffer."""
    rng = np.random.default_rng(6)
    weights = {name: (rng.standard_normal(shape) * 0.05).astype(np.float32) for name, shape in
               (("w_a", (1001, 700)), ("w_b", (1001, 350)), ("w_c", (1001, 350)), ("w_down", (1400, 1001)))}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_a"], ["a"]),
         helper.make_node("MatMul", ["x", "w_b"], ["b"]),
         helper.make_node("MatMul", ["x", "w_c"], ["c"]),
         helper.make_node("Concat", ["a", "b", "c"], ["abc"], axis=-1),
         helper.make_node("MatMul", ["abc", "w_down"], ["y"])],
        "ragged", [tensor("x", [1, 1, 1001])], [tensor("abc", [1, 1, 1400]), tensor("y", [1, 1, 1001])],
        [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    rules = set(session.recording.rewrites().rule)
    assert {"matmul_siblings", "matvec_layout"} <= rules, rules
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 1001), RUNS, np.random.default_rng(9),
                              names=("abc", "y"))
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


def _model(path=None):
    """x [1, 1, 576] -> MatMul with three 2-D weights over 1 MiB (a tall one relaid
    column-major, a wide 576x2048 kept row-major as the file has it, a padded 576x576)
    and one under it; optionally with the weights in external data at `path`."""
    rng = np.random.default_rng(3)
    weights = {name: (rng.standard_normal(shape) * 0.05).astype(np.float32) for name, shape in
               (("w_wide", (576, 2048)), ("w_tall", (2048, 576)), ("w_square", (576, 576)), ("w_small", (576, 64)))}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_wide"], ["h"]),
         helper.make_node("Relu", ["h"], ["h_pos"]),
         helper.make_node("MatMul", ["h_pos", "w_tall"], ["y"]),
         helper.make_node("MatMul", ["y", "w_square"], ["z"]),
         helper.make_node("MatMul", ["z", "w_small"], ["s"])],
        "weights", [tensor("x", [1, 1, 576])],
        [tensor("h", [1, 1, 2048]), tensor("z", [1, 1, 576]), tensor("s", [1, 1, 64])],
        [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if path is None:
        return model, model
    embedded = onnx.ModelProto()
    embedded.CopyFrom(model)  # saving moves the weights out of `model` itself
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return str(path), embedded


@needs_huge_pages
@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("wide", ["column-major", "row-major"])
def test_weights_in_huge_pages_compute_what_onnxruntime_does(tmp_path, external, wide):
    """Row-major, the wide weight is the file's, copied in; column-major, relaid there."""
    source, model = _model(tmp_path / "m.onnx" if external else None)
    session = workbench.InferenceSession(source, SessionOptions(decode_memo_verify=False, wide_weight_layout=wide))
    moved = session.recording.rewrites().query("rule == 'huge_pages'")
    by_name = session.graph.by_name
    names = set(moved.result)
    assert {"w_wide", "w_tall"} <= names and "w_small" not in names, names
    padded = [n for n, vid in by_name.items() if n.endswith("_padded") and vid in session.graph.initializers]
    assert padded and not set(padded) & names, "the padded 576x576 keeps its zero pages: not copied in"
    assert all(huge_pages.keeps_zero_pages(session.graph.initializers[by_name[n]]) for n in padded)
    for name in names:
        weight = session.graph.initializers[by_name[name]]
        assert anon_huge_kib(weight) >= 2048, f"{name} is not in huge pages"
    order = "c_contiguous" if wide == "row-major" else "f_contiguous"
    assert getattr(session.graph.initializers[by_name["w_wide"]].flags, order)
    assert session.graph.initializers[by_name["w_tall"]].flags.f_contiguous
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 576), RUNS, np.random.default_rng(8),
                              names="hzs")
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


def test_without_huge_pages_the_weights_stay_where_numpy_put_them(monkeypatch):
    monkeypatch.setattr(optimize, "huge_pages_available", lambda: False)
    model, _ = _model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    assert session.recording.rewrites().query("rule == 'huge_pages'").empty
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 576), RUNS, np.random.default_rng(2),
                              names="hzs")
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


@needs_huge_pages
def test_smollm2_shaped_llama_decodes_what_onnxruntime_does_from_huge_pages():
    """SmolLM2's widths: the fused Q/K/V, gate/up and relaid down_proj live in huge pages,
    the padded o_proj in zero pages of its own; tokens and every step's logits are onnxruntime's."""
    model = models.llama("tiny", flavor="genai", hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                         num_layers=2, vocab=512)
    peer = ort_session(model)
    session = workbench.InferenceSession(model.SerializeToString())
    # fused Q/K/V, gate/up and down_proj a layer; o_proj and this small vocabulary's lm_head are
    # padded (`matvec_threads`) into zero pages of their own, which stay where they are
    assert len(session.recording.rewrites().query("rule == 'huge_pages'")) == 2 * 3
    for kv in ("fixed", "growing"):
        want = Generator(peer).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv=kv,
                                        return_logits=True)
        got = Generator(session).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv=kv,
                                          return_logits=True)
        assert got.tokens == want.tokens, kv
        for step, (g, w) in enumerate(zip(got.logits, want.logits, strict=True)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{kv} step {step}")

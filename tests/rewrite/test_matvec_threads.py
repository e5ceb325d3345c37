"""Rule `matvec_threads` (level "all"): weights just under OpenBLAS's threading threshold
padded with zero columns, Slices (and a Concat) taking the real ones back; and the layout level "all"
gives MatMul weights on such a machine (column-major; wide weights row-major where the
`wide_weight_layout` setting asks). They
change how a product is computed (on both cores, in another order), never its value:
checked against onnxruntime run after run on one input buffer, and by a token-exact
decode of a SmolLM2-shaped llama."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper
from oracles import ort_session, runs_on_one_buffer, tensor
from pages import pages_present, resident_bytes

import workbench
import workbench.rewrite.huge_pages as huge_pages
import workbench.rewrite.matvec_threads as matvec_threads
from workbench import Generator, SessionOptions, models

RUNS = 8


@pytest.fixture
def threads(monkeypatch):
    """The rule as on a multi-core OpenBLAS machine, whatever this one's BLAS."""
    monkeypatch.setattr(matvec_threads, "openblas_threads_available", lambda: True)


def test_which_weights_are_padded_and_to_what_width():
    assert matvec_threads.padded_width(576, 576) == 801  # 576 x 801 = 461,376: past 460,800
    assert matvec_threads.padded_width(576, 799) == 801
    assert matvec_threads.padded_width(576, 800) is None, "460,800 itself is threaded"
    assert matvec_threads.padded_width(576, 801) is None, "already threaded"
    assert matvec_threads.padded_width(576, 960) is None
    assert matvec_threads.padded_width(576, 400) is None, "would stream 2x the bytes for 2x bandwidth"
    assert matvec_threads.padded_width(64, 64) is None


def test_the_real_columns_are_split_between_openblas_two_threads_on_page_boundaries():
    """OpenBLAS's first thread takes ceil(width / 2) outputs: the second half of the real
    columns starts on a 4 KiB page boundary at or before that, so the gap is whole pages."""
    first, second = matvec_threads.balanced_halves(576, 576, 801)
    assert (first, second) == (288, 400)  # 400 x 2304 bytes: 225 pages
    assert second * 576 * 4 % 4096 == 0 and (second + 576 - first) * 576 * 4 % 4096 == 0, "gaps of whole pages"
    assert matvec_threads.balanced_halves(1024, 400, 451) == (200, 226)  # a column is a page
    assert matvec_threads.balanced_halves(576, 700, 801) == (350, 400)
    assert matvec_threads.balanced_halves(576, 799, 801) is None, "already even: nothing between the halves"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_zero_tail_costs_no_memory_when_read():
    """The padding's zero columns are read every product: they must map the kernel's
    shared zero page (in cache, resident nowhere), not zeroed memory of their own."""
    before = resident_bytes()
    wide = huge_pages.zero_tail_array((1024, 16384), np.float32, "F")  # 64 MiB
    wide[:, :256] = 1.0  # the first 1 MiB, as a 1024 x 256 weight
    assert wide.sum() == 1024 * 256 and not wide[:, 256:].any()  # every page read
    grown = resident_bytes() - before
    assert grown < 8 << 20, f"reading 63 MiB of zero tail made {grown >> 20} MiB resident"
    assert wide.flags.writeable and wide.flags.f_contiguous and wide.dtype == np.float32


def test_no_padding_where_openblas_has_one_thread(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert not matvec_threads.openblas_threads_available()
    session = workbench.InferenceSession(_model(rows=1))
    assert session.recording.rewrites().query("rule == 'matvec_threads'").empty


def _model(rows: int):
    """x [1, rows, 576] -> MatMul(w_o, 576x576) -> Add -> MatMul(w_o again) and
    MatMul(w_big, 576x960, over the threshold), then elementwise consumers of each
    (strided Slice views when rows > 1)."""
    rng = np.random.default_rng(5)
    w_o = numpy_helper.from_array((rng.standard_normal((576, 576)) * 0.05).astype(np.float32), "w_o")
    w_big = numpy_helper.from_array((rng.standard_normal((576, 960)) * 0.05).astype(np.float32), "w_big")
    bias = numpy_helper.from_array(rng.standard_normal(576).astype(np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_o"], ["a"]),
         helper.make_node("Add", ["a", "bias"], ["a_b"]),
         helper.make_node("MatMul", ["a_b", "w_o"], ["b"]),
         helper.make_node("MatMul", ["x", "w_big"], ["c"]),
         helper.make_node("Mul", ["b", "b"], ["b_sq"]),
         helper.make_node("ReduceSum", ["c"], ["c_sum"], keepdims=0)],
        "pad", [tensor("x", [1, rows, 576])],
        [tensor("a", [1, rows, 576]), tensor("b_sq", [1, rows, 576]), tensor("c_sum", [])],
        [w_o, w_big, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("rows", [1, 4])
def test_padded_weights_compute_what_onnxruntime_does(threads, rows):
    model = _model(rows)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    padded = session.recording.rewrites().query("rule == 'matvec_threads'")
    assert len(padded) == 1 and len(padded.original_nodes.iloc[0]) == 2, "w_o padded once for both readers"
    ops = [n.op_type for n in session.graph.nodes]
    assert ops.count("Slice") == 4 and ops.count("Concat") == 2 and ops.count("MatMul") == 3, \
        "each reader: the product, its two halves' slices and their concatenation"
    wide = session.graph.initializers[session.graph.by_name[padded.result.iloc[0]]]
    if sys.platform.startswith("linux"):  # before anything reads them: no page of the zero columns exists
        for zeros in (wide[:, 288:400], wide[:, 688:]):
            assert not any(pages_present(zeros)), "the zero columns were written: they would stream from memory"
    assert wide.shape == (576, 801) and wide.flags.f_contiguous and huge_pages.keeps_zero_pages(wide)
    w_o = numpy_helper.to_array(model.graph.initializer[0])
    assert np.array_equal(wide[:, :288], w_o[:, :288]) and np.array_equal(wide[:, 400:688], w_o[:, 288:])
    assert not wide[:, 288:400].any() and not wide[:, 688:].any()
    assert session.graph.initializers[session.graph.by_name["w_big"]].flags.f_contiguous, \
        "576x960 is wide: column-major, as every weight, unless the setting says row-major"
    runs = runs_on_one_buffer(session, ort_session(model), (1, rows, 576), RUNS, np.random.default_rng(9),
                              names=("a", "b_sq", "c_sum"))
    for run, name, g, w in runs:
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


def test_smollm2_shaped_llama_decodes_token_exact_with_padded_projections(threads):
    """SmolLM2's widths (hidden 576, 9 heads, 3 KV heads): the attention output projection
    is padded (and this small vocabulary's lm_head); every mode decodes the same tokens as onnxruntime."""
    model = models.llama("tiny", flavor="genai", hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                         num_layers=2, vocab=512)
    peer = ort_session(model)
    want = Generator(peer).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv="fixed").tokens
    for options in (SessionOptions(), SessionOptions(capture=False, decode_memo=False),
                    SessionOptions(wide_weight_layout="row-major")):
        session = workbench.InferenceSession(model.SerializeToString(), options)
        rewrites = session.recording.rewrites()
        padded = {n for nodes in rewrites.query("rule == 'matvec_threads'").original_nodes for n in nodes}
        assert {"/model/layers.0/attn/o_proj/MatMul", "/model/layers.1/attn/o_proj/MatMul"} <= padded
        for kv in ("fixed", "growing"):
            got = Generator(session).generate(list(range(3, 11)), 10, progress=False, eos_token_id=-1, kv=kv)
            assert got.tokens == want, (kv, options)


@pytest.mark.cuda
def test_the_cuda_backend_keeps_its_weights_unpadded(threads):
    """cuBLAS has no one-thread threshold: the rule is for numpy's BLAS only."""
    model = _model(rows=1)
    session = workbench.InferenceSession(model, backend="cuda")
    assert session.recording.rewrites().query("rule == 'matvec_threads'").empty
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 576), RUNS, np.random.default_rng(4),
                              names=("a", "b_sq", "c_sum"))
    for run, name, g, w in runs:
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


def test_which_weights_are_wide():
    assert matvec_threads.is_wide(576, 960) and matvec_threads.is_wide(576, 49152)
    assert not matvec_threads.is_wide(576, 801), "about square"
    assert not matvec_threads.is_wide(1536, 576), "tall"
    assert not matvec_threads.is_wide(64, 256), "in cache and single-threaded: no rule"


def test_the_wide_weight_layout_setting_is_checked_and_read_from_the_environment(monkeypatch):
    assert SessionOptions().wide_weight_layout == "column-major"
    monkeypatch.setenv("WORKBENCH_WIDE_WEIGHT_LAYOUT", "Row-Major")
    assert SessionOptions().wide_weight_layout == "row-major"
    assert SessionOptions(wide_weight_layout="column-major").wide_weight_layout == "column-major"
    with pytest.raises(ValueError, match="wide_weight_layout must be one of"):
        SessionOptions(wide_weight_layout="auto")


def _siblings_model():
    """x [1, 1, 576] -> three MatMuls: two wide siblings (576x1000 each, fused into one
    576x2000) and a tall one (1536x576 after a Tile of x to 1536 features)."""
    rng = np.random.default_rng(11)
    w1, w2 = ((rng.standard_normal((576, 1000)) * 0.05).astype(np.float32) for _ in range(2))
    w_tall = (rng.standard_normal((1536, 576)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["g"]),
         helper.make_node("MatMul", ["x", "w2"], ["u"]),
         helper.make_node("Mul", ["g", "u"], ["h"]),
         helper.make_node("Slice", ["h", "starts", "ends", "axes"], ["h_part"]),
         helper.make_node("Concat", ["h_part", "h_part", "h_part"], ["h3"], axis=-1),
         helper.make_node("MatMul", ["h3", "w_tall"], ["y"])],
        "layouts", [tensor("x", [1, 1, 576])], [tensor("h", [1, 1, 1000]), tensor("y", [1, 1, 576])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(w_tall, "w_tall"), numpy_helper.from_array(np.array([0], np.int64), "starts"),
         numpy_helper.from_array(np.array([512], np.int64), "ends"),
         numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("setting, order", [("column-major", "f_contiguous"), ("row-major", "c_contiguous")])
def test_wide_weights_in_either_order_compute_what_onnxruntime_does(threads, setting, order):
    """The fused wide weight is written once, in the order the setting gives wide weights
    (the tall one is column-major either way), and both compute onnxruntime's values
    run after run on one input buffer."""
    model = _siblings_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, wide_weight_layout=setting))
    rewrites = session.recording.rewrites()
    fused = rewrites.query("rule == 'matmul_siblings'")
    assert len(fused) == 1
    weights = {session.graph.values[v].name: a for v, a in session.graph.initializers.items() if a.ndim == 2}
    (fused_name, fused_weight), = ((n, a) for n, a in weights.items() if a.shape == (576, 2000))
    assert getattr(fused_weight.flags, order), f"{fused_name}: wide, written {setting} once"
    assert weights["w_tall"].flags.f_contiguous
    assert rewrites.query("rule == 'matvec_layout'").result.tolist() == ["w_tall"]
    runs = runs_on_one_buffer(session, ort_session(model), (1, 1, 576), RUNS, np.random.default_rng(12),
                              names="hy")
    for run, name, got, want in runs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"run {run}: {name}")


def test_one_thread_keeps_every_weight_column_major(monkeypatch):
    monkeypatch.setattr(matvec_threads, "openblas_threads_available", lambda: False)
    session = workbench.InferenceSession(_siblings_model(), SessionOptions(decode_memo_verify=False))
    assert all(a.flags.f_contiguous for a in session.graph.initializers.values() if a.ndim == 2)

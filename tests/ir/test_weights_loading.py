"""Weights at load: external data and a model file's embedded weights are memory-mapped,
embedded bytes are viewed, nothing
is copied back into a proto, the caller's ModelProto is never changed — and the model
still decodes token-exact against onnxruntime."""

from __future__ import annotations

import mmap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import workbench
from workbench import Generator, ModelLoadError, models
from workbench.ir.loader import LARGE_INITIALIZER
from workbench.ir.wire import lift_weights


def _root(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def _big_initializers(session):
    return [a for a in session.graph.initializers.values() if a.nbytes > 4096]


def _held_as_stored(a, path, raw: bytes) -> bool:
    """Whether the loaded weight `a` is held as the file stores `raw`, its bytes: mapped
    from the file where they start aligned for the dtype, else read into an aligned
    copy of its own (both read-only)."""
    offset = path.read_bytes().find(raw)
    assert offset >= 0 and not a.flags.writeable and a.flags.aligned
    return isinstance(_root(a), mmap.mmap) == (offset % a.dtype.alignment == 0)


def _decode_both(path_or_bytes, peer_model):
    ours = Generator(workbench.InferenceSession(path_or_bytes)).generate(
        list(range(3, 11)), 12, progress=False, eos_token_id=-1, kv="fixed")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    peer = Generator(ort.InferenceSession(peer_model, so, providers=["CPUExecutionProvider"])).generate(
        list(range(3, 11)), 12, progress=False, eos_token_id=-1, kv="fixed")
    assert ours.tokens == peer.tokens


def test_external_weights_are_memory_mapped_read_only(tmp_path):
    model = models.llama("tiny", flavor="genai")
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    # level "basic": "extended" also fuses sibling MatMuls' weights into one, and "all"
    # relays MatMul weights column-major (deliberate copies)
    session = workbench.InferenceSession(str(path), workbench.SessionOptions(graph_optimization_level="basic"))
    big = _big_initializers(session)
    assert big and all(isinstance(_root(a), mmap.mmap) for a in big), "mapped, not read into memory"
    assert not any(a.flags.writeable for a in big), "a weight can never be written through"
    _decode_both(str(path), str(path))
    relaid = workbench.InferenceSession(str(path))
    layout = relaid.recording.rewrites()
    moved = {relaid.graph.by_name[n] for n in layout[layout.rule == "matvec_layout"].result}
    assert moved and all(relaid.graph.initializers[v].flags.f_contiguous for v in moved)
    assert all(isinstance(_root(a), mmap.mmap) or a.flags.f_contiguous for v, a in relaid.graph.initializers.items()
               if v not in moved and a.nbytes > 4096), "what is not relaid (or fused, column-major) stays mapped"


def test_embedded_weights_are_viewed_and_the_callers_proto_is_untouched():
    model = models.llama("tiny", flavor="genai")
    before = model.SerializeToString()
    # level "basic": "extended" fuses sibling weights and "all" relays them (copies)
    session = workbench.InferenceSession(model, workbench.SessionOptions(graph_optimization_level="basic"))
    assert model.SerializeToString() == before, "loading never changes the caller's ModelProto"
    big = _big_initializers(session)
    assert big and all(isinstance(_root(a), bytes) for a in big), "views of protobuf's bytes, not copies"
    assert all(not t.raw_data for t in session.model_proto.graph.initializer if t.name in
               {session.graph.values[v].name for v, a in session.graph.initializers.items() if a.nbytes > 4096}), \
        "the session's proto keeps dims only"
    _decode_both(before, before)


def test_embedded_weights_in_a_model_file_are_mapped_from_it(tmp_path):
    model = models.llama("tiny", flavor="genai")
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path)  # weights embedded in the one file
    session = workbench.InferenceSession(str(path), workbench.SessionOptions(graph_optimization_level="basic"))
    big = _big_initializers(session)
    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    names = {id(a): session.graph.values[v].name for v, a in session.graph.initializers.items()}
    assert big and all(_held_as_stored(a, path, stored[names[id(a)]].tobytes()) for a in big), \
        "mapped from the file (aligned) or an aligned copy (misaligned), never parsed"
    assert any(isinstance(_root(a), mmap.mmap) for a in big)
    for vid, a in session.graph.initializers.items():
        np.testing.assert_array_equal(a, stored[session.graph.values[vid].name])
    assert all(not t.raw_data for t in session.model_proto.graph.initializer if t.name in
               {session.graph.values[v].name for v, a in session.graph.initializers.items() if a.nbytes > 4096})
    _decode_both(str(path), str(path))


def _odd_initializers_model() -> onnx.ModelProto:
    """Big initializers the lift must hand back to protobuf (bfloat16, one inside an If
    branch) next to plain ones, small ones and typed float_data."""
    rng = np.random.default_rng(3)
    plain = numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "plain")
    small = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "small")
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [2048], rng.standard_normal(2048).tolist())
    bits = (rng.standard_normal((64, 48)).astype(np.float32).view(np.uint32) >> 16).astype("<u2")
    bf16 = helper.make_tensor("bf16", TensorProto.BFLOAT16, [64, 48], bits.tobytes(), raw=True)
    inner = numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "inner")
    branch = helper.make_graph([helper.make_node("Add", ["plain", "inner"], ["b_out"])], "then", [],
                               [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [64, 48])], [inner])
    other = helper.make_graph([helper.make_node("Identity", ["plain"], ["o_out"])], "else", [],
                              [helper.make_tensor_value_info("o_out", TensorProto.FLOAT, [64, 48])])
    nodes = [
        helper.make_node("Cast", ["bf16"], ["bf16_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "plain"], ["m"]),
        helper.make_node("Add", ["m", "bf16_f"], ["a"]),
        helper.make_node("If", ["flag"], ["picked"], then_branch=branch, else_branch=other),
        helper.make_node("Add", ["a", "picked"], ["s"]),
        helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0),
        helper.make_node("Mul", ["r", "small"], ["y0"]),
        helper.make_node("ReduceSum", ["typed"], ["t"], keepdims=0),
        helper.make_node("Add", ["y0", "t"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 48]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [plain, small, typed, bf16])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_unusual_embedded_initializers_in_a_file_match_onnx_reference(tmp_path):
    path = tmp_path / "odd.onnx"
    onnx.save_model(_odd_initializers_model(), path)
    session = workbench.InferenceSession(str(path), workbench.SessionOptions(graph_optimization_level="disabled"))
    plain = session.graph.initializers[session.graph.by_name["plain"]]
    assert _held_as_stored(plain, path, np.asarray(plain).tobytes()), "the plain float weight is mapped or aligned"
    oracle = ReferenceEvaluator(str(path))
    x = np.empty((64, 48), np.float32)  # one buffer, new contents every run
    rng = np.random.default_rng(0)
    for run in range(6):
        x[...] = rng.standard_normal((64, 48))
        flag = np.array(run % 2 == 0)
        (got,) = session.run(None, {"x": x, "flag": flag})
        (want,) = oracle.run(None, {"x": x, "flag": flag})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_wire_lift_reassembles_the_model_protobuf_would_parse():
    model = _odd_initializers_model()
    data = model.SerializeToString()
    stripped, lifted = lift_weights(memoryview(data), LARGE_INITIALIZER)
    parsed = onnx.ModelProto.FromString(stripped)
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    by_index = {item.index: item for item in lifted}
    for i, t in enumerate(expected.graph.initializer):
        if i in by_index:
            item = by_index[i]
            assert data[item.offset:item.offset + item.length] == t.raw_data
            t.ClearField("raw_data")
    assert parsed == expected
    assert {expected.graph.initializer[i].name for i in by_index} == {"plain", "bf16"}, \
        "raw_data over the threshold only, main graph only (typed float_data is not raw_data)"
    assert lift_weights(memoryview(data[:-3]), LARGE_INITIALIZER) is None, "truncated: left to protobuf"
    assert lift_weights(memoryview(b"\x3a\xff\xff\xff\xff\x0f" + data), LARGE_INITIALIZER) is None


def test_a_truncated_or_inconsistent_model_file_is_refused_clearly(tmp_path):
    data = _odd_initializers_model().SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cut.onnx"):
        workbench.InferenceSession(str(cut))
    model = _odd_initializers_model()
    w = model.graph.initializer[0]
    w.raw_data = w.raw_data[:-8]
    short = tmp_path / "short.onnx"
    onnx.save_model(model, short)
    with pytest.raises(ModelLoadError, match=r"initializer 'plain' has dims \[64, 48\].*stores 12280 bytes"):
        workbench.InferenceSession(str(short))


def _table_model(name: str) -> onnx.ModelProto:
    """An embedding Gather from a big table, then a MatMul by its transpose: the nodes
    numpy copies an unaligned array for before it computes."""
    rng = np.random.default_rng(21)
    table = numpy_helper.from_array(rng.standard_normal((1024, 16)).astype(np.float32), name)
    nodes = [helper.make_node("Gather", [name, "ids"], ["emb"], axis=0),
             helper.make_node("Transpose", [name], ["transposed"], perm=[1, 0]),
             helper.make_node("MatMul", ["emb", "transposed"], ["y"])]
    graph = helper.make_graph(nodes, "table", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1024])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _misaligned_file(tmp_path, external: bool):
    """The table's bytes at an offset that is no multiple of 4 in the model file (its
    raw_data wherever protobuf puts it: the name's length moves it) or in an external
    data file (offset 1)."""
    if external:
        model = _table_model("table")
        table = model.graph.initializer[0]
        raw = table.raw_data
        (tmp_path / "weights.bin").write_bytes(b"\0" + raw)
        onnx.external_data_helper.set_external_data(table, "weights.bin", offset=1, length=len(raw))
        table.ClearField("raw_data")
        table.data_location = TensorProto.EXTERNAL
        path = tmp_path / "external.onnx"
        path.write_bytes(model.SerializeToString())
        return path, 1, "table"
    for length in range(1, 9):
        model = _table_model("w" * length)
        data = model.SerializeToString()
        offset = data.find(model.graph.initializer[0].raw_data)
        if offset % 4:
            path = tmp_path / "embedded.onnx"
            path.write_bytes(data)
            return path, offset, "w" * length
    raise AssertionError("no name length put the table at an odd offset")


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external"])
def test_a_weight_stored_at_a_misaligned_offset_is_read_aligned(tmp_path, external):
    """A mapped weight whose bytes start at an offset misaligned for its dtype was an
    unaligned array, which numpy copies whole before a Gather or a MatMul reads it:
    every step (torch.onnx legacy's SmolLM2 embedding, 113 MB at an odd offset in the
    model file: a 30 ms Gather a token). It is read into memory of its own, read-only;
    aligned weights stay mapped. Values are onnxruntime's over runs that refill one
    input array."""
    path, offset, name = _misaligned_file(tmp_path, external)
    assert offset % 4
    session = workbench.InferenceSession(str(path))
    table = session.graph.initializers[session.graph.by_name[name]]
    assert table.flags.aligned and not table.flags.writeable
    assert not isinstance(_root(table), mmap.mmap)
    peer = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.zeros((1, 2), np.int64)
    rng = np.random.default_rng(22)
    for run in range(8):
        ids[...] = rng.integers(0, 1024, ids.shape)
        np.testing.assert_allclose(session.run(None, {"ids": ids})[0], peer.run(None, {"ids": ids})[0],
                                   rtol=1e-5, atol=1e-5, err_msg=f"run {run}")

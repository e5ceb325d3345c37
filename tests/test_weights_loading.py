"""Weights at load: external data is memory-mapped, embedded data is viewed, nothing
is copied back into a proto, the caller's ModelProto is never changed — and the model
still decodes token-exact against onnxruntime."""

from __future__ import annotations

import mmap

import onnx
import onnxruntime as ort

import workbench
from workbench import Generator, models


def _root(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def _big_initializers(session):
    return [a for a in session.graph.initializers.values() if a.nbytes > 4096]


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

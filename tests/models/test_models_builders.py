"""The built-in decoder builders: KV-cache wiring, exporter idioms, onnxruntime semantics.

Every numeric check runs the model in onnxruntime (CPUExecutionProvider): the
logits of prefill + greedy incremental decode must equal those of one full
prefill over the same tokens.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.models import (
    ModelBuildError,
    ModelConfig,
    config_of,
    count_parameters,
    gpt2,
    llama,
    phi3,
)
from workbench.models.quant import dequantize_int4, quantize_int4

RTOL = ATOL = 1e-4

BUILDS = {
    "gpt2": lambda: gpt2("tiny"),
    "llama-onnx": lambda: llama("tiny", flavor="onnx"),
    "llama-onnx-int4": lambda: llama("tiny", flavor="onnx", quant="int4"),
    "llama-genai": lambda: llama("tiny", flavor="genai"),
    "llama-genai-int4": lambda: llama("tiny", flavor="genai", quant="int4"),
    "phi3-longrope": lambda: phi3("tiny", longrope=True),
    "phi3-plain": lambda: phi3("tiny", longrope=False),
}


@functools.cache
def built(key: str) -> onnx.ModelProto:
    return BUILDS[key]()


@functools.cache
def session(key: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(built(key).SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_step(sess, cfg: ModelConfig, ids: np.ndarray, past: dict, start: int, mask_len: int | None = None):
    """One forward over `ids` at positions start.. with `past`; -> (logits, outputs)."""
    batch, seq = ids.shape
    total = start + seq if mask_len is None else mask_len
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((batch, total), np.int64), **past}
    if cfg.uses_position_ids:
        feeds["position_ids"] = np.tile(np.arange(start, start + seq, dtype=np.int64), (batch, 1))
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, feeds), strict=True))
    return outs["logits"], outs


def present_as_past(cfg: ModelConfig, outs: dict) -> dict:
    past = {}
    for i in range(cfg.num_layers):
        for p, q in zip(cfg.past_names(i), cfg.present_names(i), strict=True):
            past[p] = outs[q]
    return past


def greedy_decode(sess, cfg, prompt: np.ndarray, steps: int):
    """Prefill then `steps` greedy decode steps; -> (fed tokens, stacked logits, last outs)."""
    logits, outs = run_step(sess, cfg, prompt, cfg.empty_past(prompt.shape[0]), 0)
    tokens, chunks = prompt, [logits]
    for _ in range(steps):
        nxt = logits[:, -1:].argmax(-1).astype(np.int64)
        logits, outs = run_step(sess, cfg, nxt, present_as_past(cfg, outs), tokens.shape[1])
        tokens = np.concatenate([tokens, nxt], axis=1)
        chunks.append(logits)
    return tokens, np.concatenate(chunks, axis=1), outs


def ops_of(model: onnx.ModelProto) -> dict[tuple[str, str], list[onnx.NodeProto]]:
    found: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        found.setdefault((node.domain or "", node.op_type), []).append(node)
    return found


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy onnx.checker can read: genai's default-domain SimplifiedLayerNormalization
    (an onnxruntime-only op) moved to com.microsoft so the checker skips its schema."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "SimplifiedLayerNormalization" and not node.domain:
            node.domain = "com.microsoft"
    return copy


# -- KV cache wiring ------------------------------------------------------------------
@pytest.mark.parametrize("key", list(BUILDS))
def test_incremental_decode_matches_full_prefill(key):
    model, sess = built(key), session(key)
    cfg = config_of(model)
    prompt = np.random.default_rng(7).integers(3, cfg.vocab, (1, 5))
    tokens, incremental, outs = greedy_decode(sess, cfg, prompt, steps=3)
    assert tokens.shape == (1, 8) and incremental.shape == (1, 8, cfg.vocab)
    full, full_outs = run_step(sess, cfg, tokens, cfg.empty_past(), 0)
    np.testing.assert_allclose(incremental, full, rtol=RTOL, atol=ATOL)
    # the cache after the last decode step holds exactly the 8 tokens' keys/values
    for i in range(cfg.num_layers):
        for name in cfg.present_names(i):
            assert outs[name].shape == cfg.kv_shape(1, 8)
            np.testing.assert_allclose(outs[name], full_outs[name], rtol=RTOL, atol=ATOL)


def test_batch_of_two_decodes_like_two_singles():
    model, sess = built("llama-genai"), session("llama-genai")
    cfg = config_of(model)
    prompts = np.random.default_rng(3).integers(3, cfg.vocab, (2, 5))
    _, both, _ = greedy_decode(sess, cfg, prompts, steps=2)
    for row in range(2):
        _, single, _ = greedy_decode(sess, cfg, prompts[row : row + 1], steps=2)
        np.testing.assert_allclose(both[row : row + 1], single, rtol=RTOL, atol=ATOL)


def test_llama_flavors_compute_the_same_model():
    ids = np.random.default_rng(5).integers(3, 512, (1, 9))
    got = {}
    for key in ("llama-onnx", "llama-genai"):
        cfg = config_of(built(key))
        got[key], _ = run_step(session(key), cfg, ids, cfg.empty_past(), 0)
    np.testing.assert_allclose(got["llama-onnx"], got["llama-genai"], rtol=RTOL, atol=ATOL)


# -- interface and metadata --------------------------------------------------------------
@pytest.mark.parametrize("key", list(BUILDS))
def test_interface_and_config(key):
    model = built(key)
    cfg = config_of(model)
    inputs = {v.name: v for v in model.graph.input}
    outputs = {v.name: v for v in model.graph.output}

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert dims(inputs["input_ids"]) == ["batch_size", "sequence_length"]
    assert dims(inputs["attention_mask"]) == ["batch_size", "total_sequence_length"]
    assert ("position_ids" in inputs) == cfg.uses_position_ids == (cfg.flavor != "genai")
    assert dims(outputs["logits"]) == ["batch_size", "sequence_length", cfg.vocab]
    n_past = sum(name.startswith("past_key_values.") for name in inputs)
    assert n_past == 2 * cfg.num_layers
    for i in range(cfg.num_layers):
        for name in cfg.past_names(i):
            assert dims(inputs[name]) == ["batch_size", cfg.kv_heads, "past_sequence_length", cfg.head_dim]
        for name in cfg.present_names(i):
            assert dims(outputs[name]) == ["batch_size", cfg.kv_heads, "total_sequence_length", cfg.head_dim]
    assert cfg.size == "tiny" and cfg.seed == 0
    assert 0 <= cfg.eos_token_id < cfg.vocab
    assert count_parameters(model) < 1_000_000


def test_config_of_rejects_foreign_models():
    foreign = helper.make_model(helper.make_graph([], "empty", [], []))
    with pytest.raises(ModelBuildError, match="no 'workbench.model_config'"):
        config_of(foreign)


@pytest.mark.parametrize("key", list(BUILDS))
def test_models_pass_the_onnx_checker(key):
    model = built(key)
    genai = config_of(model).flavor == "genai"
    if genai:  # SimplifiedLayerNormalization in the default domain is onnxruntime-only
        with pytest.raises(onnx.checker.ValidationError, match="SimplifiedLayerNormalization"):
            onnx.checker.check_model(model)
    onnx.checker.check_model(checkable(model) if genai else model, full_check=True)


def test_same_seed_same_model_other_seed_other_weights():
    assert gpt2("tiny", seed=3).SerializeToString() == gpt2("tiny", seed=3).SerializeToString()
    a = numpy_helper.to_array(llama("tiny", seed=1).graph.initializer[0])
    b = numpy_helper.to_array(llama("tiny", seed=2).graph.initializer[0])
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_bad_arguments_are_named():
    with pytest.raises(ModelBuildError, match="unknown size 'huge'"):
        gpt2("huge")
    with pytest.raises(ModelBuildError, match="unknown flavor"):
        llama("tiny", flavor="tensorrt")
    with pytest.raises(ModelBuildError, match="unknown quant"):
        llama("tiny", quant="int8")
    with pytest.raises(ModelBuildError, match="head_dim % 16"):
        llama("tiny", flavor="genai", hidden=32, head_dim=8)
    with pytest.raises(ModelBuildError, match="multiple of kv_heads"):
        llama("tiny", kv_heads=3)


@pytest.mark.parametrize("build", [gpt2, llama, phi3])
def test_small_size_has_20_to_30_million_parameters(build):
    model = build("small")
    cfg = config_of(model)
    assert cfg.size == "small"
    assert 20_000_000 <= count_parameters(model) <= 30_000_000


# -- exporter idioms ---------------------------------------------------------------------
def test_gpt2_idioms():
    model = built("gpt2")
    ops = ops_of(model)
    for op in (
        "LayerNormalization",
        "Trilu",
        "Where",
        "And",
        "ConstantOfShape",
        "Split",
        "Pow",
        "Tanh",
        "Shape",
        "Gather",
        "Unsqueeze",
        "Concat",
        "Reshape",
        "Transpose",
        "Softmax",
        "Constant",
    ):
        assert ("", op) in ops, op
    assert not any(domain for domain, _ in ops)
    assert "FastGelu" not in {op for _, op in ops}
    # the head reshapes take shapes computed at run time by Concat chains
    producers = {o: n for n in model.graph.node for o in n.output}
    reshapes = ops[("", "Reshape")]
    assert reshapes and all(producers[n.input[1]].op_type == "Concat" for n in reshapes)
    # position embedding is Gathered by the position_ids input
    assert any(n.input[1] == "position_ids" for n in ops[("", "Gather")])
    # the causal Trilu keeps the lower triangle offset by past length
    (trilu,) = ops[("", "Trilu")]
    assert helper.get_attribute_value(trilu.attribute[0]) == 0  # upper=0
    assert producers[trilu.input[1]].op_type == "Sub"


def test_llama_onnx_idioms():
    model = built("llama-onnx")
    ops = ops_of(model)
    assert {d for d, _ in ops} == {""}
    assert {o.domain: o.version for o in model.opset_import} == {"": 18}
    for op in (
        "Pow",
        "ReduceMean",
        "Sqrt",
        "Div",
        "Slice",
        "Neg",
        "Expand",
        "Sigmoid",
        "Trilu",
        "Where",
        "Softmax",
    ):
        assert ("", op) in ops, op
    inits = {i.name: i for i in model.graph.initializer}
    cfg = config_of(model)
    cos = inits["model.rotary_emb.cos_cache"]
    assert list(cos.dims) == [cfg.max_positions, cfg.head_dim]
    rope_gathers = [n for n in ops[("", "Gather")] if n.input[1] == "position_ids"]
    assert len(rope_gathers) == 2
    assert cfg.kv_heads < cfg.heads
    # GQA by repetition: Unsqueeze -> Expand -> Reshape, two per layer (K and V)
    assert len(ops[("", "Expand")]) == 2 * cfg.num_layers


@pytest.mark.parametrize("key", ["llama-genai", "phi3-longrope", "phi3-plain"])
def test_genai_idioms(key):
    model = built(key)
    cfg = config_of(model)
    ops = ops_of(model)
    assert {o.domain: o.version for o in model.opset_import} == {"": 18, "com.microsoft": 1}
    assert len(ops[("", "SimplifiedLayerNormalization")]) == 1
    assert len(ops[("com.microsoft", "SkipSimplifiedLayerNormalization")]) == 2 * cfg.num_layers
    gqas = ops[("com.microsoft", "GroupQueryAttention")]
    assert len(gqas) == cfg.num_layers
    producers = {o: n for n in model.graph.node for o in n.output}
    for i, node in enumerate(gqas):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["num_heads"] == cfg.heads and attrs["kv_num_heads"] == cfg.kv_heads
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
        q, k, v, pk, pv, seqlens_k, total, cos, sin = node.input
        assert (pk, pv) == cfg.past_names(i)
        assert tuple(node.output[1:]) == cfg.present_names(i)
        assert (cos, sin) == ("cos_cache", "sin_cache")
        # seqlens_k = Cast(int32, ReduceSum(attention_mask, 1) - 1)
        cast = producers[seqlens_k]
        assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.INT32
        sub = producers[cast.input[0]]
        reduce_sum = producers[sub.input[0]]
        assert (sub.op_type, reduce_sum.op_type) == ("Sub", "ReduceSum")
        assert reduce_sum.input[0] == "attention_mask"
        # total_sequence_length = Cast(int32, Gather(Shape(attention_mask), 1))
        cast = producers[total]
        gather = producers[cast.input[0]]
        shape = producers[gather.input[0]]
        assert (cast.op_type, gather.op_type, shape.op_type) == ("Cast", "Gather", "Shape")
        assert shape.input[0] == "attention_mask"


@pytest.mark.parametrize("key", ["llama-onnx-int4", "llama-genai-int4"])
def test_int4_uses_matmulnbits(key):
    model = built(key)
    cfg = config_of(model)
    ops = ops_of(model)
    assert ("", "MatMul") not in ops or all(
        n.input[1] not in {i.name for i in model.graph.initializer} for n in ops[("", "MatMul")]
    )
    nbits = ops[("com.microsoft", "MatMulNBits")]
    assert len(nbits) == 7 * cfg.num_layers + 1  # q k v o gate up down per layer + lm_head
    inits = {i.name: i for i in model.graph.initializer}
    for node in nbits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 4 and attrs["block_size"] == 32
        packed = inits[node.input[1]]
        n_blocks = -(-attrs["K"] // 32)
        assert packed.data_type == TensorProto.UINT8
        assert list(packed.dims) == [attrs["N"], n_blocks, 16]
        assert list(inits[node.input[2]].dims) == [attrs["N"] * n_blocks]


def test_phi3_if_switches_rotary_caches():
    model = built("phi3-longrope")
    cfg = config_of(model)
    (if_node,) = ops_of(model)[("", "If")]
    assert list(if_node.output) == ["cos_cache", "sin_cache"]
    branches = {a.name: a.g for a in if_node.attribute}
    rows = {}
    for name in ("then_branch", "else_branch"):
        consts = [n for n in branches[name].node if n.op_type == "Constant"]
        assert len(consts) == 2 and len(branches[name].node) == 2
        rows[name] = numpy_helper.to_array(consts[0].attribute[0].t).shape
    assert rows["then_branch"] == (cfg.max_positions, cfg.head_dim // 2)
    assert rows["else_branch"] == (cfg.original_max_positions, cfg.head_dim // 2)
    producers = {o: n for n in model.graph.node for o in n.output}
    greater = producers[if_node.input[0]]
    assert greater.op_type == "Greater"
    consumers = [n for n in model.graph.node if "cos_cache" in n.input]
    assert {n.op_type for n in consumers} == {"GroupQueryAttention"}
    assert len(consumers) == cfg.num_layers
    assert config_of(built("phi3-plain")).original_max_positions == 0
    assert ("", "If") not in ops_of(built("phi3-plain"))


def test_phi3_decode_across_original_max_positions():
    """Up to the threshold, incremental == full prefill. Past it, the If hands GQA the
    long caches, but keys already cached keep their short-cache rotation (GQA rotates
    only the new tokens with whatever caches it is given), exactly as in the genai
    runtime: decoding across the threshold therefore equals a prefill of the first
    `original_max` tokens followed by one chunk over the rest, and differs from a
    single prefill over all tokens (which rotates every key with the long caches)."""
    model, sess = built("phi3-longrope"), session("phi3-longrope")
    cfg = config_of(model)
    limit = cfg.original_max_positions  # 16 for tiny
    prompt = np.random.default_rng(11).integers(3, cfg.vocab, (1, limit - 2))
    tokens, incremental, _ = greedy_decode(sess, cfg, prompt, steps=6)  # totals 15..20
    assert tokens.shape[1] == limit + 4

    below, _ = run_step(sess, cfg, tokens[:, :limit], cfg.empty_past(), 0)
    np.testing.assert_allclose(incremental[:, :limit], below, rtol=RTOL, atol=ATOL)

    _, outs = run_step(sess, cfg, tokens[:, :limit], cfg.empty_past(), 0)
    chunk, _ = run_step(sess, cfg, tokens[:, limit:], present_as_past(cfg, outs), limit)
    np.testing.assert_allclose(incremental[:, limit:], chunk, rtol=RTOL, atol=ATOL)

    full, _ = run_step(sess, cfg, tokens, cfg.empty_past(), 0)
    assert np.abs(full[:, limit:] - incremental[:, limit:]).max() > 1e-2  # the flip is live
    assert np.abs(full[:, :limit] - incremental[:, :limit]).max() > 1e-2  # ...for all rows


# -- onnxruntime semantics the executor must reproduce ----------------------------------
def test_gqa_separate_vs_shared_kv_buffers():
    """Separate buffers: present = past + new (total length). Shared buffer: a past
    tensor longer than total_sequence_length is kept at its size; the new token lands
    at index seqlens_k and the logits are unchanged."""
    model, sess = built("llama-genai"), session("llama-genai")
    cfg = config_of(model)
    prompt = np.random.default_rng(2).integers(3, cfg.vocab, (1, 5))
    _, outs = run_step(sess, cfg, prompt, cfg.empty_past(), 0)
    past = present_as_past(cfg, outs)
    nxt = np.array([[9]], np.int64)

    separate, sep_outs = run_step(sess, cfg, nxt, past, 5)
    assert sep_outs["present.0.key"].shape == cfg.kv_shape(1, 6)

    capacity = 12
    shared_past = {}
    for name, value in past.items():
        buf = np.zeros(cfg.kv_shape(1, capacity), np.float32)
        buf[:, :, :5] = value
        shared_past[name] = buf
    shared, sh_outs = run_step(sess, cfg, nxt, shared_past, 5, mask_len=6)
    np.testing.assert_allclose(shared, separate, rtol=RTOL, atol=ATOL)
    for i in range(cfg.num_layers):
        for name in cfg.present_names(i):
            assert sh_outs[name].shape == cfg.kv_shape(1, capacity)
            np.testing.assert_allclose(sh_outs[name][:, :, :6], sep_outs[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("k, symmetric", [(64, False), (40, False), (96, True)])
def test_int4_quantization_matches_onnxruntime_matmulnbits(k, symmetric):
    rng = np.random.default_rng(k)
    n = 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    qw = quantize_int4(w, symmetric=symmetric)
    deq = dequantize_int4(qw)
    assert deq.shape == (k, n)
    assert np.abs(deq - w).max() <= np.abs(w).max() / 7  # within a quantization step
    inits = [numpy_helper.from_array(qw.packed, "B"), numpy_helper.from_array(qw.scales, "s")]
    inputs = ["A", "B", "s"]
    if qw.zero_points is not None:
        inits.append(numpy_helper.from_array(qw.zero_points, "zp"))
        inputs.append("zp")
    node = helper.make_node(
        "MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=32
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, n])],
        inits,
    )
    model = helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
    )
    a = rng.standard_normal((3, k)).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": a}
    )
    np.testing.assert_allclose(y, a @ deq, rtol=1e-4, atol=1e-4)

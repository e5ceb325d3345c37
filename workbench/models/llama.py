"""Llama in two dialects over the same seeded weights.

flavor="onnx": standard ops as the torch dynamo exporter emits at opset 18 —
RMSNorm written out (Pow/ReduceMean/Add/Sqrt/Div/Mul), RoPE from full-width
cos/sin cache initializers Gathered by `position_ids`, rotate-half via
Slice/Neg/Concat, grouped-query attention by repeating KV heads
(Unsqueeze/Expand/Reshape), SwiGLU, and a Trilu/Where causal mask.

flavor="genai": as onnxruntime-genai's model builder emits for CPU fp32 —
SimplifiedLayerNormalization (default domain) then
com.microsoft::SkipSimplifiedLayerNormalization, com.microsoft::GroupQueryAttention
with do_rotary=1 and half-width cos/sin caches, `seqlens_k` / `total_sequence_length`
derived from `attention_mask`, no `position_ids` input. quant="int4" turns every
linear layer into com.microsoft::MatMulNBits.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnx import ModelProto, TensorProto

from .blocks import (
    Weights,
    batch_and_seq,
    causal_mask,
    decoder_io,
    linear,
    masked_softmax_attention,
    merge_heads,
    rope_tables,
    split_heads,
)
from .config import ModelBuildError, ModelConfig, attach_config, resolve_config
from .graph_builder import MS_DOMAIN, GraphBuilder

SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        family="llama",
        num_layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        ffn=192,
        vocab=512,
        max_positions=128,
        eos_token_id=2,
        bos_token_id=1,
        norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    "small": ModelConfig(
        family="llama",
        num_layers=6,
        hidden=512,
        heads=8,
        kv_heads=2,
        head_dim=64,
        ffn=1408,
        vocab=8192,
        max_positions=2048,
        eos_token_id=2,
        bos_token_id=1,
        norm_eps=1e-5,
        rope_theta=10000.0,
    ),
}

FLAVORS = ("onnx", "genai")


@dataclasses.dataclass
class LayerWeights:
    input_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    post_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


@dataclasses.dataclass
class DecoderWeights:
    embed: np.ndarray
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: np.ndarray


def decoder_weights(cfg: ModelConfig, seed: int) -> DecoderWeights:
    """Seeded Llama-shaped weights ([K, N] for every linear), flavour independent."""
    w = Weights(seed)
    E, F = cfg.hidden, cfg.ffn
    q_width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    embed = w.normal((cfg.vocab, E), 1.0)
    layers = [
        LayerWeights(
            input_norm=w.norm(E),
            q=w.linear(E, q_width),
            k=w.linear(E, kv_width),
            v=w.linear(E, kv_width),
            o=w.linear(q_width, E),
            post_norm=w.norm(E),
            gate=w.linear(E, F),
            up=w.linear(E, F),
            down=w.linear(F, E),
        )
        for _ in range(cfg.num_layers)
    ]
    return DecoderWeights(embed, layers, w.norm(E), w.linear(E, cfg.vocab))


# -- flavor="onnx" ---------------------------------------------------------------
def _rms_norm(b: GraphBuilder, x: str, weight: np.ndarray, eps: float, *, node: str, name: str) -> str:
    """x * 1/sqrt(mean(x^2) + eps) * weight, op by op; `name` names the weight."""
    p = node
    sq = b.node("Pow", [x, b.f32_scalar(2.0)], name=f"{p}/Pow")
    var = b.node("ReduceMean", [sq, b.i64(-1)], name=f"{p}/ReduceMean", keepdims=1)
    var = b.node("Add", [var, b.f32_scalar(eps)], name=f"{p}/Add")
    rstd = b.node("Div", [b.f32_scalar(1.0), b.node("Sqrt", [var], name=f"{p}/Sqrt")], name=f"{p}/Div")
    y = b.node("Mul", [x, rstd], name=f"{p}/Mul")
    return b.node("Mul", [b.initializer(f"{name}.weight", weight), y], name=f"{p}/Mul_1")


def _rotate_half(b: GraphBuilder, x: str, half: int, *, prefix: str) -> str:
    x1 = b.node("Slice", [x, b.i64(0), b.i64(half), b.i64(-1), b.i64(1)], name=f"{prefix}/Slice")
    x2 = b.node(
        "Slice",
        [x, b.i64(half), b.i64(np.iinfo(np.int64).max), b.i64(-1), b.i64(1)],
        name=f"{prefix}/Slice_1",
    )
    neg = b.node("Neg", [x2], name=f"{prefix}/Neg")
    return b.node("Concat", [neg, x1], name=f"{prefix}/Concat", axis=-1)


def _apply_rope(b: GraphBuilder, x: str, cos: str, sin: str, half: int, *, prefix: str) -> str:
    a = b.node("Mul", [x, cos], name=f"{prefix}/Mul")
    rot = _rotate_half(b, x, half, prefix=f"{prefix}/rotate_half")
    c = b.node("Mul", [rot, sin], name=f"{prefix}/Mul_1")
    return b.node("Add", [a, c], name=f"{prefix}/Add")


def _repeat_kv(b: GraphBuilder, x: str, batch: str, cfg: ModelConfig, *, prefix: str) -> str:
    """[B, KV, T, D] -> Unsqueeze(2) -> Expand [B, KV, rep, T, D] -> Reshape [B, H, T, D]."""
    rep = cfg.heads // cfg.kv_heads
    if rep == 1:
        return x
    total = b.unsqueeze0(b.dim(x, 2, name=f"{prefix}/total"), name=f"{prefix}/total")
    x5 = b.node("Unsqueeze", [x, b.i64(2)], name=f"{prefix}/Unsqueeze")
    shape5 = b.shape_of([batch, cfg.kv_heads, rep, total, cfg.head_dim], name=f"{prefix}/expand")
    x5 = b.node("Expand", [x5, shape5], name=f"{prefix}/Expand")
    shape4 = b.shape_of([batch, cfg.heads, total, cfg.head_dim], name=f"{prefix}/reshape")
    return b.node("Reshape", [x5, shape4], name=f"{prefix}/Reshape")


def _build_onnx(cfg: ModelConfig, wts: DecoderWeights, *, attention_op: bool = False) -> ModelProto:
    """`attention_op=True`: each layer's attention (past concat, GQA and the masked
    softmax) is one opset-23 `Attention` node, as torch's dynamo exporter emits at opset 23."""
    b = GraphBuilder(cfg.family)
    if attention_op:
        b.domains[""] = 23
    io = decoder_io(b, cfg, position_ids=True)
    H, D = cfg.heads, cfg.head_dim
    x = b.node(
        "Gather",
        [b.initializer("model.embed_tokens.weight", wts.embed), io["input_ids"]],
        name="/model/embed_tokens/Gather",
    )
    mask = causal_mask(b, io["input_ids"], io["attention_mask"], prefix="/model/mask")

    cos, sin = rope_tables(D, cfg.max_positions, cfg.rope_theta)
    cos_full = b.initializer("model.rotary_emb.cos_cache", np.concatenate([cos, cos], -1))
    sin_full = b.initializer("model.rotary_emb.sin_cache", np.concatenate([sin, sin], -1))
    cos = b.node("Gather", [cos_full, io["position_ids"]], name="/model/rotary_emb/Gather")
    sin = b.node("Gather", [sin_full, io["position_ids"]], name="/model/rotary_emb/Gather_1")
    cos = b.node("Unsqueeze", [cos, b.i64(1)], name="/model/rotary_emb/Unsqueeze")
    sin = b.node("Unsqueeze", [sin, b.i64(1)], name="/model/rotary_emb/Unsqueeze_1")

    for i, lw in enumerate(wts.layers):
        p, n = f"model.layers.{i}", f"/model/layers.{i}"
        h = _rms_norm(
            b, x, lw.input_norm, cfg.norm_eps, node=f"{n}/input_layernorm", name=f"{p}.input_layernorm"
        )
        batch, seq = batch_and_seq(b, h, prefix=f"{n}/self_attn")
        q = linear(
            b, h, lw.q, node=f"{n}/self_attn/q_proj", weight=f"{p}.self_attn.q_proj.weight", quant=cfg.quant
        )
        k = linear(
            b, h, lw.k, node=f"{n}/self_attn/k_proj", weight=f"{p}.self_attn.k_proj.weight", quant=cfg.quant
        )
        v = linear(
            b, h, lw.v, node=f"{n}/self_attn/v_proj", weight=f"{p}.self_attn.v_proj.weight", quant=cfg.quant
        )
        q = split_heads(b, q, batch, seq, H, D, prefix=f"{n}/self_attn/q")
        k = split_heads(b, k, batch, seq, cfg.kv_heads, D, prefix=f"{n}/self_attn/k")
        v = split_heads(b, v, batch, seq, cfg.kv_heads, D, prefix=f"{n}/self_attn/v")
        q = _apply_rope(b, q, cos, sin, D // 2, prefix=f"{n}/self_attn/q_rope")
        k = _apply_rope(b, k, cos, sin, D // 2, prefix=f"{n}/self_attn/k_rope")
        past_k, past_v = cfg.past_names(i)
        pres_k, pres_v = cfg.present_names(i)
        if attention_op:
            a = b.node("Attention", [q, k, v, mask, past_k, past_v], name=f"{n}/self_attn/Attention",
                       outputs=[f"{n}/self_attn/Attention/output_0", pres_k, pres_v], scale=1.0 / math.sqrt(D))[0]
        else:
            k = b.node("Concat", [past_k, k], name=f"{n}/self_attn/Concat", outputs=[pres_k], axis=2)
            v = b.node("Concat", [past_v, v], name=f"{n}/self_attn/Concat_1", outputs=[pres_v], axis=2)
            k = _repeat_kv(b, k, batch, cfg, prefix=f"{n}/self_attn/repeat_kv")
            v = _repeat_kv(b, v, batch, cfg, prefix=f"{n}/self_attn/repeat_kv_1")
            a = masked_softmax_attention(b, q, k, v, mask, 1.0 / math.sqrt(D), prefix=f"{n}/self_attn")
        a = merge_heads(b, a, batch, seq, H * D, prefix=f"{n}/self_attn/merge")
        a = linear(
            b, a, lw.o, node=f"{n}/self_attn/o_proj", weight=f"{p}.self_attn.o_proj.weight", quant=cfg.quant
        )
        x = b.node("Add", [x, a], name=f"{n}/Add")

        h = _rms_norm(
            b,
            x,
            lw.post_norm,
            cfg.norm_eps,
            node=f"{n}/post_attention_layernorm",
            name=f"{p}.post_attention_layernorm",
        )
        g = linear(
            b, h, lw.gate, node=f"{n}/mlp/gate_proj", weight=f"{p}.mlp.gate_proj.weight", quant=cfg.quant
        )
        u = linear(b, h, lw.up, node=f"{n}/mlp/up_proj", weight=f"{p}.mlp.up_proj.weight", quant=cfg.quant)
        g = b.node("Mul", [g, b.node("Sigmoid", [g], name=f"{n}/mlp/act/Sigmoid")], name=f"{n}/mlp/act/Mul")
        m = b.node("Mul", [g, u], name=f"{n}/mlp/Mul")
        m = linear(
            b, m, lw.down, node=f"{n}/mlp/down_proj", weight=f"{p}.mlp.down_proj.weight", quant=cfg.quant
        )
        x = b.node("Add", [x, m], name=f"{n}/Add_1")

    x = _rms_norm(b, x, wts.final_norm, cfg.norm_eps, node="/model/norm", name="model.norm")
    linear(b, x, wts.lm_head, node="/lm_head", weight="lm_head.weight", quant=cfg.quant, out="logits")
    model = b.make_model()
    if attention_op:
        model.ir_version = 11  # opset 23 needs IR 11
    return model


# -- flavor="genai" --------------------------------------------------------------
def genai_mask_inputs(b: GraphBuilder, attention_mask: str) -> tuple[str, str, str]:
    """(seqlens_k int32 [B, 1], total_sequence_length int32 0-D, total int64 0-D).

    seqlens_k = Cast(int32, ReduceSum(attention_mask, axes=[1], keepdims=1) - 1)
    total_sequence_length = Cast(int32, Gather(Shape(attention_mask), 1))
    """
    p = "/model/attn_mask_reformat/attn_mask_subgraph"
    s = b.node("ReduceSum", [attention_mask, b.i64(1)], name=f"{p}/ReduceSum", keepdims=1)
    s = b.node("Sub", [s, b.i64(1)], name=f"{p}/Sub")
    seqlens_k = b.node("Cast", [s], name=f"{p}/Sub/Cast", to=TensorProto.INT32)
    shape = b.node("Shape", [attention_mask], name=f"{p}/Shape")
    total64 = b.node("Gather", [shape, b.i64_scalar(1)], name=f"{p}/Gather", axis=0)
    total32 = b.node("Cast", [total64], name=f"{p}/Gather/Cast", to=TensorProto.INT32)
    return seqlens_k, total32, total64


def _skip_norm(
    b: GraphBuilder, root: str, skip: str, weight: np.ndarray, eps: float, *, name: str, last: bool = False
) -> tuple[str, str | None]:
    """SkipSimplifiedLayerNormalization -> (normed, residual sum) (sum omitted if last)."""
    node = f"/model/{name}/SkipLayerNorm"
    outs = [f"{node}/output_0"] if last else [f"{node}/output_0", "", "", f"{node}/output_3"]
    res = b.node(
        "SkipSimplifiedLayerNormalization",
        [root, skip, b.initializer(f"model.{name}.weight", weight)],
        name=node,
        outputs=outs,
        domain=MS_DOMAIN,
        epsilon=eps,
    )
    return (res, None) if last else (res[0], res[3])


def build_genai(cfg: ModelConfig, wts: DecoderWeights, rope, *, packed: bool = False) -> ModelProto:
    """The genai-style graph; `rope(b, total64) -> (cos_cache, sin_cache)` names.

    `packed=True` multiplies Q, K and V as one `qkv_proj` MatMul feeding
    GroupQueryAttention's packed-QKV form (key/value inputs empty), and gate and up
    as one `gate_up_proj` MatMul split in two: the same model in fewer, larger
    products (as the genai builder packs quantized projections).
    """
    if cfg.head_dim % 16:
        raise ModelBuildError(
            f"{cfg.family}: GroupQueryAttention with do_rotary=1 needs head_dim % 16 == 0, got {cfg.head_dim}"
        )
    b = GraphBuilder(cfg.family)
    io = decoder_io(b, cfg, position_ids=False)
    seqlens_k, total32, total64 = genai_mask_inputs(b, io["attention_mask"])
    cos_cache, sin_cache = rope(b, total64)
    x = b.node(
        "Gather",
        [b.initializer("model.embed_tokens.weight", wts.embed), io["input_ids"]],
        name="/model/embed_tokens/Gather",
    )
    residual = x
    h = b.node(
        "SimplifiedLayerNormalization",
        [x, b.initializer("model.layers.0.input_layernorm.weight", wts.layers[0].input_norm)],
        name="/model/layers.0/input_layernorm/LayerNorm",
        axis=-1,
        epsilon=cfg.norm_eps,
        stash_type=1,
    )
    for i, lw in enumerate(wts.layers):
        p = f"model.layers.{i}"
        if i > 0:
            h, residual = _skip_norm(
                b, residual, x, lw.input_norm, cfg.norm_eps, name=f"layers.{i}/input_layernorm"
            )
        if packed:
            q = linear(
                b,
                h,
                np.concatenate([lw.q, lw.k, lw.v], axis=1),
                node=f"/model/layers.{i}/attn/qkv_proj",
                weight=f"{p}.attn.qkv_proj.MatMul.weight",
                quant=cfg.quant,
            )
            k = v = ""
        else:
            q, k, v = (
                linear(b, h, getattr(lw, n), node=f"/model/layers.{i}/attn/{n}_proj",
                       weight=f"{p}.attn.{n}_proj.MatMul.weight", quant=cfg.quant)
                for n in ("q", "k", "v")
            )
        past_k, past_v = cfg.past_names(i)
        pres_k, pres_v = cfg.present_names(i)
        gqa = f"/model/layers.{i}/attn/GroupQueryAttention"
        a = b.node(
            "GroupQueryAttention",
            [q, k, v, past_k, past_v, seqlens_k, total32, cos_cache, sin_cache],
            name=gqa,
            outputs=[f"{gqa}/output_0", pres_k, pres_v],
            domain=MS_DOMAIN,
            num_heads=cfg.heads,
            kv_num_heads=cfg.kv_heads,
            scale=1.0 / math.sqrt(cfg.head_dim),
            local_window_size=-1,
            do_rotary=1,
            rotary_interleaved=0,
        )[0]
        a = linear(
            b,
            a,
            lw.o,
            node=f"/model/layers.{i}/attn/o_proj",
            weight=f"{p}.attn.o_proj.MatMul.weight",
            quant=cfg.quant,
        )
        h, residual = _skip_norm(
            b, residual, a, lw.post_norm, cfg.norm_eps, name=f"layers.{i}/post_attention_layernorm"
        )
        if packed:
            gu = linear(
                b,
                h,
                np.concatenate([lw.gate, lw.up], axis=1),
                node=f"/model/layers.{i}/mlp/gate_up_proj",
                weight=f"{p}.mlp.gate_up_proj.MatMul.weight",
                quant=cfg.quant,
            )
            g, u = b.node(
                "Split",
                [gu, b.i64(cfg.ffn, cfg.ffn)],
                name=f"/model/layers.{i}/mlp/gate_up_proj/Split",
                n_outputs=2,
                axis=-1,
            )
        else:
            g, u = (
                linear(b, h, getattr(lw, n), node=f"/model/layers.{i}/mlp/{n}_proj",
                       weight=f"{p}.mlp.{n}_proj.MatMul.weight", quant=cfg.quant)
                for n in ("gate", "up")
            )
        g = b.node(
            "Mul",
            [g, b.node("Sigmoid", [g], name=f"/model/layers.{i}/mlp/act_fn/Sigmoid")],
            name=f"/model/layers.{i}/mlp/act_fn/Mul",
        )
        m = b.node("Mul", [g, u], name=f"/model/layers.{i}/mlp/Mul")
        x = linear(
            b,
            m,
            lw.down,
            node=f"/model/layers.{i}/mlp/down_proj",
            weight=f"{p}.mlp.down_proj.MatMul.weight",
            quant=cfg.quant,
        )
    h, _ = _skip_norm(
        b, residual, x, wts.final_norm, cfg.norm_eps, name="layers.final_norm_layernorm", last=True
    )
    linear(b, h, wts.lm_head, node="/lm_head", weight="lm_head.MatMul.weight", quant=cfg.quant, out="logits")
    return b.make_model()


def plain_rope(cfg: ModelConfig, factors: np.ndarray | None = None):
    """Half-width cos/sin cache initializers; `factors` divide the inverse frequencies
    (llama.cpp's `rope_freqs`, Llama-3.1 style), one per rotary pair."""

    def rope(b: GraphBuilder, total64: str) -> tuple[str, str]:
        cos, sin = rope_tables(cfg.head_dim, cfg.max_positions, cfg.rope_theta, factors)
        return b.initializer("cos_cache", cos), b.initializer("sin_cache", sin)

    return rope


def check_weights(cfg: ModelConfig, wts: DecoderWeights) -> None:
    """Every weight has the [K, N] (or [N]) shape `cfg` implies, or ModelBuildError names it."""
    E, F, V = cfg.hidden, cfg.ffn, cfg.vocab
    q_width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    if len(wts.layers) != cfg.num_layers:
        raise ModelBuildError(
            f"{cfg.family}: {len(wts.layers)} layers of weights for num_layers={cfg.num_layers}"
        )
    expected = [("embed", wts.embed, (V, E)), ("final_norm", wts.final_norm, (E,)),
                ("lm_head", wts.lm_head, (E, V))]
    for i, lw in enumerate(wts.layers):
        expected += [
            (f"layers.{i}.input_norm", lw.input_norm, (E,)),
            (f"layers.{i}.q", lw.q, (E, q_width)),
            (f"layers.{i}.k", lw.k, (E, kv_width)),
            (f"layers.{i}.v", lw.v, (E, kv_width)),
            (f"layers.{i}.o", lw.o, (q_width, E)),
            (f"layers.{i}.post_norm", lw.post_norm, (E,)),
            (f"layers.{i}.gate", lw.gate, (E, F)),
            (f"layers.{i}.up", lw.up, (E, F)),
            (f"layers.{i}.down", lw.down, (F, E)),
        ]
    for name, array, shape in expected:
        if tuple(np.shape(array)) != shape:
            raise ModelBuildError(
                f"{cfg.family}: weight {name} has shape {tuple(np.shape(array))}, expected {shape}"
            )
        if np.asarray(array).dtype != np.float32:
            raise ModelBuildError(f"{cfg.family}: weight {name} is {np.asarray(array).dtype}, expected float32")


def llama_genai_from_weights(
    cfg: ModelConfig, wts: DecoderWeights, *, rope_factors: np.ndarray | None = None, packed: bool = False
) -> ModelProto:
    """The genai-flavour Llama graph over caller-supplied weights (e.g. read from a GGUF).

    `wts` holds float32 weights, every linear as [K, N] (the transpose of a torch
    `Linear.weight`); `cfg` must say flavor="genai". The model carries `cfg`.
    `packed=True`: one QKV and one gate/up MatMul per layer (see `build_genai`).
    """
    if cfg.flavor != "genai":
        raise ModelBuildError(f"{cfg.family}: llama_genai_from_weights builds flavor='genai', got {cfg.flavor!r}")
    if cfg.quant is not None:
        raise ModelBuildError(f"{cfg.family}: llama_genai_from_weights takes float weights, not quant={cfg.quant!r}")
    if cfg.heads % cfg.kv_heads:
        raise ModelBuildError(
            f"{cfg.family}: heads ({cfg.heads}) must be a multiple of kv_heads ({cfg.kv_heads})"
        )
    check_weights(cfg, wts)
    if rope_factors is not None and np.shape(rope_factors) != (cfg.head_dim // 2,):
        raise ModelBuildError(
            f"{cfg.family}: rope_factors has shape {np.shape(rope_factors)}, expected ({cfg.head_dim // 2},)"
        )
    return attach_config(build_genai(cfg, wts, plain_rope(cfg, rope_factors), packed=packed), cfg)


#: exporter interfaces `llama(export=...)` re-dresses a model in (see `workbench.models.exports`)
EXPORTS = {
    "genai-builder": "genai",  # onnxruntime-genai's model builder: symbolic 'kv_cache_dim' head size
    "optimum-merged": "onnx",  # optimum's merged decoder: If(use_cache_branch)
    "torch-dynamo-attention": "onnx",  # torch dynamo at opset 23: one Attention node per layer
}


def llama(
    size: str = "tiny", flavor: str = "onnx", seed: int = 0, quant: str | None = None, *,
    export: str | None = None, mask_dtype: str = "int64", **overrides
) -> ModelProto:
    """A Llama decoder (GQA, RoPE, SwiGLU) in the `flavor` dialect.

    `export=` gives the model the exact decode interface of one exporter (without
    the workbench config metadata, as real exports have none): "genai-builder"
    (flavor="genai"; `mask_dtype="int32"` for an int32 attention_mask),
    "optimum-merged" or "torch-dynamo-attention" (flavor="onnx"). For transformers'
    two-graph export see `workbench.models.transformers_export`.
    """
    if flavor not in FLAVORS:
        raise ModelBuildError(f"llama: unknown flavor {flavor!r}; expected one of {FLAVORS}")
    if quant not in (None, "int4"):
        raise ModelBuildError(f"llama: unknown quant {quant!r}; expected None or 'int4'")
    if export is not None and EXPORTS.get(export) != flavor:
        want = f"flavor={EXPORTS[export]!r}" if export in EXPORTS else f"one of {sorted(EXPORTS)}"
        raise ModelBuildError(f"llama: export={export!r} needs {want} (got flavor={flavor!r})")
    if mask_dtype != "int64" and export != "genai-builder":
        raise ModelBuildError(f"llama: mask_dtype={mask_dtype!r} is for export='genai-builder'")
    cfg = resolve_config("llama", SIZES, size, dict(overrides, seed=seed, flavor=flavor, quant=quant))
    wts = decoder_weights(cfg, seed)
    if flavor == "onnx":
        model = _build_onnx(cfg, wts, attention_op=export == "torch-dynamo-attention")
    else:
        model = build_genai(cfg, wts, plain_rope(cfg))
    model = attach_config(model, cfg)
    if export is None:
        return model
    from . import exports  # noqa: PLC0415 - exports reads configs the builders attach

    if export == "genai-builder":
        return exports.genai_builder(model, mask_dtype=mask_dtype)
    if export == "optimum-merged":
        return exports.optimum_merged(model)
    exports.drop_config(model)
    model.producer_name = "pytorch"
    return model

"""GPT-2 as the TorchScript / optimum exporters emit it (standard ops, opset 18).

Idioms: LayerNormalization; tanh-GELU written out (Pow/Mul/Add/Tanh); learned
positions Gathered by `position_ids`; fused c_attn MatMul+Add then Split; head
reshapes whose shapes come from Shape/Gather/Unsqueeze/Concat chains; the KV cache
grown by Concat on the sequence axis; a causal mask from Trilu combined with the
padding mask and applied with Where; Constant nodes for small constants.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import ModelProto

from .blocks import (
    Weights,
    batch_and_seq,
    causal_mask,
    decoder_io,
    masked_softmax_attention,
    merge_heads,
    split_heads,
)
from .config import ModelBuildError, ModelConfig, attach_config, resolve_config
from .graph_builder import GraphBuilder

SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        family="gpt2",
        num_layers=2,
        hidden=64,
        heads=4,
        kv_heads=4,
        head_dim=16,
        ffn=256,
        vocab=256,
        max_positions=128,
        eos_token_id=255,
        bos_token_id=255,
    ),
    "small": ModelConfig(
        family="gpt2",
        num_layers=8,
        hidden=384,
        heads=6,
        kv_heads=6,
        head_dim=64,
        ffn=1536,
        vocab=10240,
        max_positions=1024,
        eos_token_id=10239,
        bos_token_id=10239,
    ),
}


def _path(name: str) -> str:
    """`transformer.h.0.attn.c_attn` -> `/transformer/h.0/attn/c_attn` (TorchScript scopes)."""
    parts: list[str] = []
    for part in name.split("."):
        if part.isdigit() and parts:
            parts[-1] = f"{parts[-1]}.{part}"
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _gelu_tanh(b: GraphBuilder, x: str, *, prefix: str) -> str:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cube = b.node("Pow", [x, b.f32_scalar(3.0)], name=f"{prefix}/Pow")
    inner = b.node("Mul", [cube, b.f32_scalar(0.044715)], name=f"{prefix}/Mul")
    inner = b.node("Add", [x, inner], name=f"{prefix}/Add")
    inner = b.node("Mul", [inner, b.f32_scalar(math.sqrt(2.0 / math.pi))], name=f"{prefix}/Mul_1")
    t = b.node("Tanh", [inner], name=f"{prefix}/Tanh")
    t = b.node("Add", [t, b.f32_scalar(1.0)], name=f"{prefix}/Add_1")
    half = b.node("Mul", [x, b.f32_scalar(0.5)], name=f"{prefix}/Mul_2")
    return b.node("Mul", [half, t], name=f"{prefix}/Mul_3")


def _layer_norm(b: GraphBuilder, x: str, w: Weights, width: int, eps: float, *, name: str) -> str:
    scale = b.initializer(f"{name}.weight", w.norm(width))
    bias = b.initializer(f"{name}.bias", w.normal((width,), 0.02))
    return b.node(
        "LayerNormalization", [x, scale, bias], name=f"{_path(name)}/LayerNormalization", axis=-1, epsilon=eps
    )


def _dense(b: GraphBuilder, x: str, w: Weights, k: int, n: int, *, name: str) -> str:
    out = b.node("MatMul", [x, b.initializer(f"{name}.weight", w.linear(k, n))], name=f"{_path(name)}/MatMul")
    return b.node(
        "Add", [b.initializer(f"{name}.bias", w.normal((n,), 0.02)), out], name=f"{_path(name)}/Add"
    )


def gpt2(size: str = "tiny", seed: int = 0, **overrides) -> ModelProto:
    """A GPT-2 decoder with a growing KV cache; `overrides` patch the ModelConfig."""
    cfg = resolve_config("gpt2", SIZES, size, dict(overrides, seed=seed, flavor="onnx"))
    if cfg.kv_heads != cfg.heads:
        raise ModelBuildError("gpt2 has no grouped-query attention: kv_heads must equal heads")
    E, H, D = cfg.hidden, cfg.heads, cfg.head_dim
    if H * D != E:
        raise ModelBuildError(f"gpt2 needs heads * head_dim == hidden ({H} * {D} != {E})")
    w = Weights(seed)
    b = GraphBuilder("gpt2", constant_nodes=True)
    io = decoder_io(b, cfg, position_ids=True)

    wte = w.normal((cfg.vocab, E), 0.5)
    tok = b.node(
        "Gather",
        [b.initializer("transformer.wte.weight", wte), io["input_ids"]],
        name="/transformer/wte/Gather",
    )
    pos = b.node(
        "Gather",
        [b.initializer("transformer.wpe.weight", w.normal((cfg.max_positions, E), 0.1)), io["position_ids"]],
        name="/transformer/wpe/Gather",
    )
    x = b.node("Add", [tok, pos], name="/transformer/Add")
    mask = causal_mask(b, io["input_ids"], io["attention_mask"], prefix="/transformer/mask")

    for i in range(cfg.num_layers):
        p = f"transformer.h.{i}"
        h = _layer_norm(b, x, w, E, cfg.norm_eps, name=f"{p}.ln_1")
        qkv = _dense(b, h, w, E, 3 * E, name=f"{p}.attn.c_attn")
        q, k, v = b.node("Split", [qkv, b.i64(E, E, E)], name=f"{_path(p)}/attn/Split", n_outputs=3, axis=2)
        batch, seq = batch_and_seq(b, h, prefix=f"{_path(p)}/attn")
        q = split_heads(b, q, batch, seq, H, D, prefix=f"{_path(p)}/attn/q")
        k = split_heads(b, k, batch, seq, H, D, prefix=f"{_path(p)}/attn/k")
        v = split_heads(b, v, batch, seq, H, D, prefix=f"{_path(p)}/attn/v")
        past_k, past_v = cfg.past_names(i)
        pres_k, pres_v = cfg.present_names(i)
        k = b.node("Concat", [past_k, k], name=f"{_path(p)}/attn/Concat_k", outputs=[pres_k], axis=-2)
        v = b.node("Concat", [past_v, v], name=f"{_path(p)}/attn/Concat_v", outputs=[pres_v], axis=-2)
        a = masked_softmax_attention(b, q, k, v, mask, 1.0 / math.sqrt(D), prefix=f"{_path(p)}/attn")
        a = merge_heads(b, a, batch, seq, E, prefix=f"{_path(p)}/attn/merge")
        a = _dense(b, a, w, E, E, name=f"{p}.attn.c_proj")
        x = b.node("Add", [x, a], name=f"{_path(p)}/Add")

        h = _layer_norm(b, x, w, E, cfg.norm_eps, name=f"{p}.ln_2")
        m = _dense(b, h, w, E, cfg.ffn, name=f"{p}.mlp.c_fc")
        m = _gelu_tanh(b, m, prefix=f"{_path(p)}/mlp/act")
        m = _dense(b, m, w, cfg.ffn, E, name=f"{p}.mlp.c_proj")
        x = b.node("Add", [x, m], name=f"{_path(p)}/Add_1")

    x = _layer_norm(b, x, w, E, cfg.norm_eps, name="transformer.ln_f")
    # Tied LM head: exporters fold the transposed embedding into its own initializer.
    lm = b.initializer("lm_head.weight", np.ascontiguousarray(wte.T))
    b.node("MatMul", [x, lm], name="/lm_head/MatMul", outputs=["logits"])
    return attach_config(b.make_model(), cfg)


__all__ = ["SIZES", "gpt2"]

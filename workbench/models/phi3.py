"""Phi-3 as onnxruntime-genai's model builder emits it (LongRoPE variant).

The graph is the Llama genai graph (SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization, GroupQueryAttention with do_rotary=1, SwiGLU)
plus, with `longrope=True`, the genai multi-cache subgraph:

    attention_mask -> Shape -> Gather(1) -> Greater(original_max) -> If
        then: Constant cos_cache_large, Constant sin_cache_large  [max_positions, D/2]
        else: Constant cos_cache_small, Constant sin_cache_small  [original_max, D/2]

whose two outputs feed every GroupQueryAttention's cos_cache / sin_cache.
Note the flip is not retroactive: keys already in the KV cache keep the rotation
of the caches that were active when they were written (as in the genai runtime).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from .blocks import rope_tables
from .config import ModelBuildError, ModelConfig, attach_config, resolve_config
from .graph_builder import GraphBuilder
from .llama import build_genai, decoder_weights, plain_rope

SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        family="phi3",
        num_layers=2,
        hidden=64,
        heads=4,
        kv_heads=4,
        head_dim=16,
        ffn=128,
        vocab=320,
        max_positions=128,
        original_max_positions=16,
        eos_token_id=256,
        bos_token_id=1,
        norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    "small": ModelConfig(
        family="phi3",
        num_layers=6,
        hidden=512,
        heads=8,
        kv_heads=8,
        head_dim=64,
        ffn=1280,
        vocab=8192,
        max_positions=4096,
        original_max_positions=512,
        eos_token_id=8000,
        bos_token_id=1,
        norm_eps=1e-5,
        rope_theta=10000.0,
    ),
}


def longrope_factors(head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (short, long) per-frequency rescale factors, shape [head_dim // 2]."""
    ramp = np.linspace(0.0, 1.0, head_dim // 2)
    return 1.0 + 0.1 * ramp, 1.0 + 7.0 * ramp**2


def longrope_mscale(cfg: ModelConfig) -> float:
    scale = cfg.max_positions / cfg.original_max_positions
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(cfg.original_max_positions))


def longrope_tables(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """cos/sin caches: `*_large` [max_positions, D/2], `*_small` [original_max, D/2]."""
    short, long = longrope_factors(cfg.head_dim)
    mscale = longrope_mscale(cfg)
    cos_l, sin_l = rope_tables(cfg.head_dim, cfg.max_positions, cfg.rope_theta, long, mscale)
    cos_s, sin_s = rope_tables(cfg.head_dim, cfg.original_max_positions, cfg.rope_theta, short, mscale)
    return {
        "cos_cache_large": cos_l,
        "sin_cache_large": sin_l,
        "cos_cache_small": cos_s,
        "sin_cache_small": sin_s,
    }


def _branch(name: str, which: str, tables: dict[str, np.ndarray]):
    nodes, outputs = [], []
    for kind in ("cos", "sin"):
        key = f"{kind}_cache_{which}"
        nodes.append(
            helper.make_node(
                "Constant",
                [],
                [key],
                name=f"/{which}/{kind}_cache/Constant",
                value=numpy_helper.from_array(tables[key]),
            )
        )
        outputs.append(helper.make_tensor_value_info(key, TensorProto.FLOAT, list(tables[key].shape)))
    return helper.make_graph(nodes, name, [], outputs)


def _longrope(cfg: ModelConfig):
    tables = longrope_tables(cfg)

    def rope(b: GraphBuilder, total64: str) -> tuple[str, str]:
        p = "/model/rotemb_caches_subgraph"
        cond = b.node("Greater", [total64, b.i64_scalar(cfg.original_max_positions)], name=f"{p}/Greater")
        return b.node(
            "If",
            [cond],
            name=f"{p}/If",
            outputs=["cos_cache", "sin_cache"],
            then_branch=_branch("large_rotemb_caches_graph", "large", tables),
            else_branch=_branch("small_rotemb_caches_graph", "small", tables),
        )

    return rope


def phi3(
    size: str = "tiny",
    longrope: bool = True,
    flavor: str = "genai",
    seed: int = 0,
    quant: str | None = None,
    **overrides,
) -> ModelProto:
    """A Phi-3 decoder in the genai dialect; `longrope` adds the If cache switch."""
    if flavor != "genai":
        raise ModelBuildError(f"phi3: only flavor='genai' is built, got {flavor!r}")
    if quant not in (None, "int4"):
        raise ModelBuildError(f"phi3: unknown quant {quant!r}; expected None or 'int4'")
    cfg = resolve_config("phi3", SIZES, size, dict(overrides, seed=seed, flavor=flavor, quant=quant))
    if not longrope:
        cfg = dataclasses.replace(cfg, original_max_positions=0)
    elif not 0 < cfg.original_max_positions <= cfg.max_positions:
        raise ModelBuildError(
            f"phi3: original_max_positions ({cfg.original_max_positions}) must be in "
            f"(0, max_positions={cfg.max_positions}] for LongRoPE"
        )
    wts = decoder_weights(cfg, seed)
    rope = _longrope(cfg) if longrope else plain_rope(cfg)
    return attach_config(build_genai(cfg, wts, rope), cfg)

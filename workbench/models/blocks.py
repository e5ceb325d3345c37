"""Graph pieces shared by the builders: weights, masks, RoPE caches, linears."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, numpy_helper

from .config import BATCH, PAST, SEQ, TOTAL, ModelBuildError, ModelConfig
from .graph_builder import MS_DOMAIN, GraphBuilder
from .quant import quantize_int4

FLOAT_MIN = float(np.finfo(np.float32).min)


class Weights:
    """Seeded weights drawn in a fixed order: same seed, same model."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def linear(self, k: int, n: int) -> np.ndarray:
        """A [K, N] MatMul weight with unit-variance outputs."""
        return self.normal((k, n), 1.0 / np.sqrt(k))

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + self.normal((n,), 0.1)).astype(np.float32)


def decoder_io(b: GraphBuilder, cfg: ModelConfig, *, position_ids: bool) -> dict[str, str]:
    """Declare the decode interface inputs/outputs shared by every builder."""
    io = {
        "input_ids": b.input("input_ids", TensorProto.INT64, [BATCH, SEQ]),
        "attention_mask": b.input("attention_mask", TensorProto.INT64, [BATCH, TOTAL]),
    }
    if position_ids:
        io["position_ids"] = b.input("position_ids", TensorProto.INT64, [BATCH, SEQ])
    for i in range(cfg.num_layers):
        for name in cfg.past_names(i):
            b.input(name, TensorProto.FLOAT, [BATCH, cfg.kv_heads, PAST, cfg.head_dim])
    b.output("logits", TensorProto.FLOAT, [BATCH, SEQ, cfg.vocab])
    for i in range(cfg.num_layers):
        for name in cfg.present_names(i):
            b.output(name, TensorProto.FLOAT, [BATCH, cfg.kv_heads, TOTAL, cfg.head_dim])
    return io


def causal_mask(b: GraphBuilder, input_ids: str, attention_mask: str, *, prefix: str) -> str:
    """bool [B, 1, S, T]: query i may see key j iff j <= past + i and mask[j] == 1.

    Built the way the TorchScript/optimum exporters do: sizes from Shape/Gather,
    a ones matrix from ConstantOfShape, `Trilu(upper=0, k=past_len)`, and the
    padding mask unsqueezed to [B, 1, 1, T] and combined with `And`.
    """
    seq = b.dim(input_ids, 1, name=f"{prefix}/seq_len")
    total = b.dim(attention_mask, 1, name=f"{prefix}/total_len")
    past = b.node("Sub", [total, seq], name=f"{prefix}/past_len/Sub")
    square = b.shape_of(
        [b.unsqueeze0(seq, name=f"{prefix}/rows"), b.unsqueeze0(total, name=f"{prefix}/cols")],
        name=f"{prefix}/shape",
    )
    ones = b.node(
        "ConstantOfShape",
        [square],
        name=f"{prefix}/ConstantOfShape",
        value=numpy_helper.from_array(np.ones(1, np.float32)),
    )
    tri = b.node("Trilu", [ones, past], name=f"{prefix}/Trilu", upper=0)
    causal = b.node("Cast", [tri], name=f"{prefix}/causal/Cast", to=TensorProto.BOOL)
    pad = b.node("Unsqueeze", [attention_mask, b.i64(1, 2)], name=f"{prefix}/pad/Unsqueeze")
    pad = b.node("Cast", [pad], name=f"{prefix}/pad/Cast", to=TensorProto.BOOL)
    return b.node("And", [causal, pad], name=f"{prefix}/And")


def masked_softmax_attention(
    b: GraphBuilder, q: str, k: str, v: str, mask: str, scale: float, *, prefix: str
) -> str:
    """softmax(Where(mask, q @ k^T * scale, min)) @ v on [B, H, *, D] tensors."""
    kt = b.node("Transpose", [k], name=f"{prefix}/k/Transpose", perm=[0, 1, 3, 2])
    scores = b.node("MatMul", [q, kt], name=f"{prefix}/qk/MatMul")
    scores = b.node("Mul", [scores, b.f32_scalar(scale)], name=f"{prefix}/scale/Mul")
    scores = b.node("Where", [mask, scores, b.f32_scalar(FLOAT_MIN)], name=f"{prefix}/Where")
    probs = b.node("Softmax", [scores], name=f"{prefix}/Softmax", axis=-1)
    return b.node("MatMul", [probs, v], name=f"{prefix}/pv/MatMul")


def split_heads(
    b: GraphBuilder, x: str, batch: str, seq: str, heads: int, head_dim: int, *, prefix: str
) -> str:
    """[B, S, heads*D] -> Reshape(Concat(B, S, heads, D)) -> Transpose -> [B, heads, S, D]."""
    shape = b.shape_of([batch, seq, heads, head_dim], name=f"{prefix}/shape")
    x = b.node("Reshape", [x, shape], name=f"{prefix}/Reshape")
    return b.node("Transpose", [x], name=f"{prefix}/Transpose", perm=[0, 2, 1, 3])


def merge_heads(b: GraphBuilder, x: str, batch: str, seq: str, width: int, *, prefix: str) -> str:
    """[B, H, S, D] -> Transpose -> Reshape(Concat(B, S, H*D))."""
    x = b.node("Transpose", [x], name=f"{prefix}/Transpose", perm=[0, 2, 1, 3])
    shape = b.shape_of([batch, seq, width], name=f"{prefix}/shape")
    return b.node("Reshape", [x, shape], name=f"{prefix}/Reshape")


def batch_and_seq(b: GraphBuilder, x: str, *, prefix: str) -> tuple[str, str]:
    """1-element int64 tensors holding dims 0 and 1 of `x` (Shape/Gather/Unsqueeze)."""
    batch = b.unsqueeze0(b.dim(x, 0, name=f"{prefix}/batch"), name=f"{prefix}/batch")
    seq = b.unsqueeze0(b.dim(x, 1, name=f"{prefix}/seq"), name=f"{prefix}/seq")
    return batch, seq


def rope_tables(
    head_dim: int, length: int, theta: float, factors: np.ndarray | None = None, mscale: float = 1.0
):
    """cos, sin float32 [length, head_dim // 2] (non-interleaved RoPE)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / (theta**exponent)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors, np.float64)
    freqs = np.outer(np.arange(length, dtype=np.float64), inv_freq)
    return ((np.cos(freqs) * mscale).astype(np.float32), (np.sin(freqs) * mscale).astype(np.float32))


def linear(
    b: GraphBuilder,
    x: str,
    w: np.ndarray,
    *,
    node: str,
    weight: str,
    quant: str | None,
    out: str | None = None,
) -> str:
    """x @ w as `<node>/MatMul`, or `<node>/MatMulNBits` (com.microsoft) for quant="int4"."""
    outputs = [out] if out else None
    if quant is None:
        return b.node("MatMul", [x, b.initializer(weight, w)], name=f"{node}/MatMul", outputs=outputs)
    if quant != "int4":
        raise ModelBuildError(f"unknown quant {quant!r} for {node}; expected None or 'int4'")
    qw = quantize_int4(w)
    inputs = [x, b.initializer(f"{weight}_Q4", qw.packed), b.initializer(f"{weight}_scales", qw.scales)]
    if qw.zero_points is not None:
        inputs.append(b.initializer(f"{weight}_zp", qw.zero_points))
    return b.node(
        "MatMulNBits",
        inputs,
        name=f"{node}/MatMulNBits",
        outputs=outputs,
        domain=MS_DOMAIN,
        K=qw.K,
        N=qw.N,
        bits=4,
        block_size=qw.block_size,
        accuracy_level=0,
    )

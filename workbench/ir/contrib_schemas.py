"""Shape inference for onnxruntime's ops that `onnx` does not know.

ONNX shape inference stops at the first com.microsoft op (GroupQueryAttention,
SkipSimplifiedLayerNormalization, ...) and everything downstream loses its
shape, so nothing there could be preallocated, written in place or captured.
These schemas teach onnx the output shapes of those ops; they are registered
only for the duration of one `infer_shapes` call, so the process-wide onnx
registry (and onnx.checker) is left as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import onnx
from onnx import TensorProto, defs

MS = "com.microsoft"
_ANY = [f"tensor({t})" for t in ("float", "float16", "double", "bfloat16", "int64", "int32", "uint8",
                                  "int8", "bool")]


def _dims(ctx, i: int) -> list | None:
    if i >= ctx.get_num_inputs() or not ctx.has_input(i):
        return None
    t = ctx.get_input_type(i)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return list(t.tensor_type.shape.dim)


def _elem(ctx, i: int) -> int:
    t = ctx.get_input_type(i)
    return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else 0


def _set(ctx, out: int, elem: int, dims: list | None) -> None:
    if out >= ctx.get_num_outputs() or not ctx.has_output(out):
        return
    t = onnx.TypeProto()
    t.tensor_type.elem_type = elem
    if dims is not None:
        shape = t.tensor_type.shape
        shape.SetInParent()
        for d in dims:
            new = shape.dim.add()
            if isinstance(d, int):
                new.dim_value = d
            elif isinstance(d, str):
                new.dim_param = d
            elif d is not None:
                new.CopyFrom(d)
    ctx.set_output_type(out, t)


def _attr(ctx, name: str, default):
    a = ctx.get_attribute(name)
    if a is None:
        return default
    return onnx.helper.get_attribute_value(a)


def _same_as_input(ctx) -> None:
    _set(ctx, 0, _elem(ctx, 0), _dims(ctx, 0))


def _skip_norm(ctx) -> None:
    dims = _dims(ctx, 0)
    _set(ctx, 0, _elem(ctx, 0), dims)
    stats = None if dims is None else dims[:-1] + [1]
    _set(ctx, 1, TensorProto.FLOAT, stats)
    _set(ctx, 2, TensorProto.FLOAT, stats)
    _set(ctx, 3, _elem(ctx, 0), dims)


def _simplified_norm(ctx) -> None:
    dims = _dims(ctx, 0)
    _set(ctx, 0, _elem(ctx, 1) or _elem(ctx, 0), dims)
    if dims is not None:
        axis = _attr(ctx, "axis", -1) % len(dims)
        stats = dims[:axis] + [1] * (len(dims) - axis)
        _set(ctx, 1, _attr(ctx, "stash_type", TensorProto.FLOAT), stats)


def _matmul_nbits(ctx) -> None:
    dims = _dims(ctx, 0)
    _set(ctx, 0, _elem(ctx, 0), None if dims is None else dims[:-1] + [int(_attr(ctx, "N", 0))])


def _gather_block_quantized(ctx) -> None:
    """indices.shape replaces data's gather_axis; uint8 data unpacks its last axis 8 / bits
    values per byte (onnxruntime requires gather_axis 0, quantize_axis last there)."""
    data, indices = _dims(ctx, 0), _dims(ctx, 1)
    out = None
    if data is not None and indices is not None and data:
        axis = int(_attr(ctx, "gather_axis", 0)) % len(data)
        out = data[:axis] + indices + data[axis + 1:]
        per_byte = 8 // int(_attr(ctx, "bits", 4)) if _elem(ctx, 0) == TensorProto.UINT8 else 1
        if per_byte > 1 and len(out) > 0:
            last = out[-1]
            out[-1] = last.dim_value * per_byte if last.HasField("dim_value") else None
    _set(ctx, 0, _elem(ctx, 2), out)


def _gqa(ctx) -> None:
    q = _dims(ctx, 0)
    heads, kv_heads = int(_attr(ctx, "num_heads", 0)), int(_attr(ctx, "kv_num_heads", 0))
    packed = not ctx.has_input(1) if ctx.get_num_inputs() > 1 else True
    out = None
    if q is not None and len(q) == 3 and q[2].HasField("dim_value") and heads:
        hidden = q[2].dim_value
        head_size = hidden // (heads + 2 * kv_heads) if packed else hidden // heads
        out = [q[0], q[1], heads * head_size]
    _set(ctx, 0, _elem(ctx, 0), out)
    past = _dims(ctx, 3)
    # present's length is max(past, total_sequence_length): leave it to the declared output
    present = None if past is None else [past[0], past[1], None, past[3]]
    _set(ctx, 1, _elem(ctx, 0), present)
    _set(ctx, 2, _elem(ctx, 0), present)


def _dim_list(dims: list | None) -> list | None:
    return None if dims is None else list(dims)


def _same_dim(a, b) -> bool:
    return a.SerializeToString() == b.SerializeToString()


def _product_dims(a: list | None, b: list | None) -> list | None:
    """a @ b where the batch dims are provably a's (b 2-D, or equal batch dims)."""
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    if len(b) == 2 or (len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a[:-2], b[:-2]))):
        return a[:-1] + [b[-1]]
    return None


def _fused_matmul(ctx) -> None:
    a, b = _dim_list(_dims(ctx, 0)), _dim_list(_dims(ctx, 1))
    out = None
    if not _attr(ctx, "transBatchA", 0) and not _attr(ctx, "transBatchB", 0) and a and b:
        if _attr(ctx, "transA", 0) and len(a) >= 2:
            a[-1], a[-2] = a[-2], a[-1]
        if _attr(ctx, "transB", 0) and len(b) >= 2:
            b[-1], b[-2] = b[-2], b[-1]
        out = _product_dims(a, b)
    _set(ctx, 0, _elem(ctx, 0), out)


def _integer_product_to_float(ctx) -> None:
    """MatMulIntegerToFloat (output typed like a_scale) / DynamicQuantizeMatMul (float)."""
    elem = _elem(ctx, 2) if ctx.get_num_inputs() > 2 and ctx.has_input(2) else TensorProto.FLOAT
    _set(ctx, 0, elem or TensorProto.FLOAT, _product_dims(_dims(ctx, 0), _dims(ctx, 1)))


def _dynamic_quantize_matmul(ctx) -> None:
    _set(ctx, 0, TensorProto.FLOAT, _product_dims(_dims(ctx, 0), _dims(ctx, 1)))


def _gemm_dims(ctx, a_index: int, b_index: int) -> list | None:
    a, b = _dims(ctx, a_index), _dims(ctx, b_index)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    m = a[1] if _attr(ctx, "transA", 0) else a[0]
    n = b[0] if _attr(ctx, "transB", 0) else b[1]
    return [m, n]


def _qgemm(ctx) -> None:
    quantized = ctx.get_num_inputs() > 8 and ctx.has_input(8)
    _set(ctx, 0, _elem(ctx, 8) if quantized else TensorProto.FLOAT, _gemm_dims(ctx, 0, 3))


def _fused_gemm(ctx) -> None:
    _set(ctx, 0, _elem(ctx, 0), _gemm_dims(ctx, 0, 1))


def _qlinear_binary(ctx) -> None:
    a, b = _dims(ctx, 0), _dims(ctx, 3)
    same = a is not None and b is not None and len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b))
    _set(ctx, 0, _elem(ctx, 0), a if same else None)


def _gemm_fast_gelu(ctx) -> None:
    _set(ctx, 0, _elem(ctx, 0), _product_dims(_dims(ctx, 0), _dims(ctx, 1)))


def _ms_attention(ctx) -> None:
    x, w = _dims(ctx, 0), _dims(ctx, 1)
    sizes = list(_attr(ctx, "qkv_hidden_sizes", []) or [])
    v_width = sizes[2] if len(sizes) == 3 else (w[1].dim_value // 3 if w and w[1].HasField("dim_value") else None)
    out = [x[0], x[1], v_width] if x is not None and len(x) == 3 and v_width else None
    _set(ctx, 0, _elem(ctx, 0), out)
    _set(ctx, 1, _elem(ctx, 0), None)


def _multi_head_attention(ctx) -> None:
    q = _dims(ctx, 0)
    v = _dims(ctx, 2) if ctx.get_num_inputs() > 2 and ctx.has_input(2) else None
    out = [q[0], q[1], v[2]] if q is not None and len(q) == 3 and v is not None and len(v) == 3 else None
    _set(ctx, 0, _elem(ctx, 0), out)
    for i in (1, 2, 3):
        _set(ctx, i, _elem(ctx, 0), None)


def _embed_layer_norm(ctx) -> None:
    ids, word = _dims(ctx, 0), _dims(ctx, 2)
    out = [ids[0], ids[1], word[1]] if ids is not None and len(ids) == 2 and word is not None else None
    _set(ctx, 0, _elem(ctx, 2), out)
    _set(ctx, 1, TensorProto.INT32, None if ids is None else [ids[0]])
    _set(ctx, 2, _elem(ctx, 2), out)


# (op, domain, n inputs, n outputs, inference)
_SCHEMAS: list[tuple[str, str, int, int, Callable]] = [
    ("GroupQueryAttention", MS, 17, 4, _gqa),
    ("SkipSimplifiedLayerNormalization", MS, 4, 4, _skip_norm),
    ("SkipLayerNormalization", MS, 5, 4, _skip_norm),
    ("RotaryEmbedding", MS, 4, 1, _same_as_input),
    ("MatMulNBits", MS, 6, 1, _matmul_nbits),
    ("GatherBlockQuantized", MS, 4, 1, _gather_block_quantized),
    ("FastGelu", MS, 2, 1, _same_as_input),
    ("QuickGelu", MS, 1, 1, _same_as_input),
    ("SimplifiedLayerNormalization", "", 2, 2, _simplified_norm),
    ("Gelu", MS, 1, 1, _same_as_input),
    ("BiasGelu", MS, 2, 1, _same_as_input),
    ("BiasAdd", MS, 3, 1, _same_as_input),
    ("FusedMatMul", MS, 2, 1, _fused_matmul),
    ("FusedGemm", MS, 3, 1, _fused_gemm),
    ("GemmFastGelu", MS, 3, 1, _gemm_fast_gelu),
    ("MatMulIntegerToFloat", MS, 7, 1, _integer_product_to_float),
    ("DynamicQuantizeMatMul", MS, 5, 1, _dynamic_quantize_matmul),
    ("QGemm", MS, 9, 1, _qgemm),
    ("QLinearAdd", MS, 8, 1, _qlinear_binary),
    ("QLinearMul", MS, 8, 1, _qlinear_binary),
    ("Attention", MS, 7, 2, _ms_attention),
    ("MultiHeadAttention", MS, 10, 4, _multi_head_attention),
    ("EmbedLayerNormalization", MS, 9, 3, _embed_layer_norm),
]


def _schema(op: str, domain: str, n_in: int, n_out: int, infer: Callable) -> defs.OpSchema:
    param = defs.OpSchema.FormalParameter
    optional = defs.OpSchema.FormalParameterOption.Optional
    inputs = [param(f"input{i}", "T", param_option=optional) for i in range(n_in)]
    outputs = [param(f"output{i}", "T", param_option=optional) for i in range(n_out)]
    schema = defs.OpSchema(op, domain, 1, inputs=inputs, outputs=outputs,
                           type_constraints=[("T", _ANY, "any tensor")])
    schema.set_type_and_shape_inference_function(infer)
    return schema


@contextlib.contextmanager
def contrib_shape_inference(opsets: dict[str, int]) -> Iterator[None]:
    """Register the schemas onnx lacks for the duration of the block."""
    added = []
    for op, domain, n_in, n_out, infer in _SCHEMAS:
        if domain not in opsets:
            continue
        try:
            defs.get_schema(op, opsets[domain], domain)
            continue  # onnx knows it already (e.g. a newer onnx)
        except defs.SchemaError:
            pass
        try:
            defs.register_schema(_schema(op, domain, n_in, n_out, infer))
            added.append((op, domain))
        except Exception:  # noqa: BLE001 - another thread registered it: fine
            continue
    try:
        yield
    finally:
        for op, domain in added:
            with contextlib.suppress(Exception):
                defs.deregister_schema(op, 1, domain)

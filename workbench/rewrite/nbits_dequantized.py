"""Level "all": a MatMulNBits over constant weights becomes a MatMul over those
weights dequantized once at load (rule `nbits_dequantized`).

The MatMulNBits kernel already dequantizes a constant weight at build time and then
multiplies by it in float32 every call (`ops.contrib_quant`; onnxruntime's levels 0-3
compute in float32 too). As a plain MatMul the same product is what the MatMul rules
after this one see: Q/K/V and gate/up fused into one product (`matmul_siblings`),
weights padded past OpenBLAS's threading threshold, laid out for one-token products and
placed in huge pages, as a float model's are. The invariant: the dequantized weight is
the kernel's own (`dequantize_nbits`), so the product changes only with those rules' summation
order, as theirs do. Measured on the small genai int4 llama, 2 cores, 20 rounds
alternating with onnxruntime: 2.30 -> 1.94 of its per-token time. (onnxruntime
streams the 4-bit weights themselves, which numpy cannot multiply by; dequantizing
them per call would cost more than streaming float32.)

Left as they are: float16 A (its product is rounded to float16, a MatMul over a float32
weight would not type-check), accuracy_level 4 where onnxruntime quantizes A to int8
(`uses_int8_compute`), weights fed at run time, empty weights (an omitted projection)
and weights over the kernel's own caching cap.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import KernelError
from ..ir.graph import Graph, Node
from ..ops.contrib_quant import CACHE_LIMIT_ELEMENTS, dequantize_nbits, nbits_layout, uses_int8_compute
from .graph_edit import Rewrite, add_initializer, add_value, make_node
from .kernel_info import node_info

_F32 = np.dtype(np.float32)


def dequantize_nbits_weights(graph: Graph) -> list[Rewrite]:
    rewrites = []
    for node in list(graph.nodes):
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            rewrite = _as_matmul(graph, node)
            if rewrite is not None:
                rewrites.append(rewrite)
    return rewrites


def _as_matmul(graph: Graph, node: Node) -> Rewrite | None:
    inputs = tuple(node.inputs) + (-1,) * (6 - len(node.inputs))
    a, b, scales, zero_points, g_idx, bias = inputs[:6]
    consts = graph.initializers
    if (a < 0 or graph.values[a].dtype != _F32 or b not in consts or scales not in consts
            or (zero_points >= 0 and zero_points not in consts) or (g_idx >= 0 and g_idx not in consts)
            or not node.outputs or node.outputs[0] < 0 or any(o >= 0 for o in node.outputs[1:])):
        return None
    info = node_info(graph, node, np, None)
    try:
        K, N, bits, block_size = nbits_layout(info)
    except KernelError:
        return None  # the kernel reports it when the plan is built
    if uses_int8_compute(info) or consts[b].size == 0 or N * K > CACHE_LIMIT_ELEMENTS:
        return None
    weight = dequantize_nbits(np, consts[b], consts[scales], consts[zero_points] if zero_points >= 0 else None,
                              consts[g_idx] if g_idx >= 0 else None, N=N, K=K, bits=bits, block_size=block_size)
    w_id = add_initializer(graph, f"{node.name}/dequantized_weight", np.ascontiguousarray(weight.T))
    y = node.outputs[0]
    replaced = [dataclasses.replace(node, op_type="MatMul", domain="", inputs=(a, w_id), outputs=(y,), attrs={})]
    if bias >= 0:
        product = add_value(graph, f"{graph.values[y].name}/product", _F32, graph.values[y].shape)
        replaced = [dataclasses.replace(replaced[0], outputs=(product,)),
                    make_node(graph, f"{node.name}/bias", "Add", [product, bias], [y])]
    at = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.nodes[at:at + 1] = replaced
    # the packed inputs, read by nothing now, go with optimize's unused-initializer pass
    return Rewrite("nbits_dequantized", (node.name,), ("MatMulNBits",), graph.values[w_id].name,
                   1 - len(replaced), graph.initializers[w_id].nbytes, kept=True)

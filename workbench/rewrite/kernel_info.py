"""What a kernel is told about a node: an `ir` node as `ops`' `NodeInfo`.

The one bridge from the graph to a kernel build. The executor's plan binds every
node's kernel through it, and the load-time rules that run a kernel (constant
folding, `nbits_dequantized`) build theirs through it too, so a value computed at
load comes from the kernel a run would use, built from the same description.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir.graph import Graph, Node
from ..ops.contrib_quant import int8_compute_layout
from ..ops.registry import NodeInfo

SMALL_CONSTANT = 64  # elements: initializers this small are shown to kernel builders


#: ops that quantize float activations at run time (a static scale, a dynamic one, or
#: int8 products inside), where one ulp of difference upstream can move a value to the
#: next integer and the difference grows from there; and ops multiplying quantized
#: integers, whose sums onnxruntime's kernels take in their own way on some CPUs
#: (`ops.quantize.u8s8_pairs_saturate`)
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul",
                           "DynamicQuantizeLSTM", "QAttention", "QGemm", "MatMulInteger", "QLinearMatMul",
                           "MatMulIntegerToFloat", "ConvInteger", "QLinearConv"})


def requantizes_activations(graph: Graph) -> bool:
    """Whether any node of `graph` or its subgraphs quantizes float activations at run
    time or multiplies quantized integers: an op of QUANTIZED_OPS, or a MatMulNBits
    computed in int8 (accuracy_level 4: onnxruntime quantizes its A per block). There,
    the work must be done as onnxruntime does it for the integers to agree."""
    for node in graph.nodes:
        if node.op_type in QUANTIZED_OPS:
            return True
        if node.op_type == "MatMulNBits":
            zero_points = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] >= 0 else None
            g_idx = len(node.inputs) > 4 and node.inputs[4] >= 0
            zp_dtype = graph.values[zero_points].dtype if zero_points is not None else None
            if int8_compute_layout(node.attrs, zp_dtype, g_idx):
                return True
        if any(requantizes_activations(g) for g in node.subgraphs.values()):
            return True
    return False


def node_info(graph: Graph, node: Node, xp: Any, make_subgraph_runner: Callable | None,
              onnxruntime_rounding: bool = True, faster_onnxruntime_rounding: bool = True) -> NodeInfo:
    vals = graph.values
    info = NodeInfo(
        name=node.name, op_type=node.op_type, domain=node.domain,
        opset=graph.opsets.get(node.domain, graph.opsets.get("", 1)),
        attrs=node.attrs,
        input_dtypes=tuple(vals[i].dtype if i >= 0 else None for i in node.inputs),
        output_dtypes=tuple(vals[o].dtype if o >= 0 else None for o in node.outputs),
        input_shapes=tuple(vals[i].shape if i >= 0 else None for i in node.inputs),
        output_shapes=tuple(vals[o].shape if o >= 0 else None for o in node.outputs),
        output_used=tuple(o >= 0 for o in node.outputs),
        input_present=tuple(i >= 0 for i in node.inputs),
        xp=xp, subgraphs=node.subgraphs, onnxruntime_rounding=onnxruntime_rounding,
        faster_onnxruntime_rounding=faster_onnxruntime_rounding,
        constant_inputs={k: graph.initializers[i] for k, i in enumerate(node.inputs)
                         if i in graph.initializers and graph.initializers[i].size <= SMALL_CONSTANT},
        initializer_inputs={k: graph.initializers[i] for k, i in enumerate(node.inputs)
                            if i in graph.initializers},
    )
    info.outer_read_names = tuple(vals[c].name for c in node.outer_reads)
    info.make_subgraph_runner = make_subgraph_runner
    return info

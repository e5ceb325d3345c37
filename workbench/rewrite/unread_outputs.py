"""Rule ``unread_output`` (every level but "disabled"): optional outputs nothing reads.

What it rewrites: an output of a node that its op declares optional, which no node,
subgraph capture or graph output reads, is left out (its id becomes -1, as for an
output the model file names with ""). Exporters name such outputs anyway: transformers'
exporter after onnxruntime's CPU fusions gives every SkipSimplifiedLayerNormalization
its mean and inverse-std outputs, read by nothing. A named output is a buffer the
executor preallocates and a result the kernel must write, and it keeps the kernel off
the forms that compute the normalized row alone (the compiled one-row norm).

The invariant: a run observes only the graph's outputs, reached only through reads
(`graph_edit.read_values`); an optional output's absence changes only whether that
value is made, never another output of the node (ONNX's and onnxruntime's kernels
compute each output the same whether or not the others are asked for).

Optional outputs: ONNX's schema where it has the op; for onnxruntime's contrib ops
onnx does not know, the ones listed in `CONTRIB_OPTIONAL` (from their schemas in
onnxruntime's contrib_defs: the statistics of the fused norms).
"""

from __future__ import annotations

import dataclasses

import onnx.defs

from ..ir.graph import Graph
from .graph_edit import Rewrite, read_values

_MS = "com.microsoft"

#: (domain, op type) -> the positions of its optional outputs, for ops onnx has no schema of
CONTRIB_OPTIONAL: dict[tuple[str, str], frozenset[int]] = {
    (_MS, "SkipLayerNormalization"): frozenset({1, 2, 3}),  # mean, inv_std_var, input_skip_bias_sum
    (_MS, "SkipSimplifiedLayerNormalization"): frozenset({1, 2, 3}),
    ("", "SimplifiedLayerNormalization"): frozenset({1}),  # inv_std_var (onnxruntime's, default domain)
}


def optional_outputs(domain: str, op_type: str, opset: int) -> frozenset[int]:
    """The positions of the op's optional outputs (none where neither schema is known)."""
    listed = CONTRIB_OPTIONAL.get((domain, op_type))
    if listed is not None:
        return listed
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return frozenset()
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    return frozenset(i for i, o in enumerate(schema.outputs) if o.option == optional)


def drop_unread_outputs(graph: Graph) -> list[Rewrite]:
    read = read_values(graph)
    rewrites = []
    for k, node in enumerate(graph.nodes):
        unread = [j for j, vid in enumerate(node.outputs) if vid >= 0 and vid not in read]
        if not unread:
            continue
        optional = optional_outputs(node.domain, node.op_type, graph.opsets.get(node.domain, graph.opsets.get("", 1)))
        dropped = [j for j in unread if j in optional]
        if not dropped:
            continue
        names = ", ".join(graph.values[node.outputs[j]].name for j in dropped)
        graph.nodes[k] = dataclasses.replace(
            node, outputs=tuple(-1 if j in dropped else vid for j, vid in enumerate(node.outputs)))
        rewrites.append(Rewrite("unread_output", (node.name,), (node.op_type,),
                                f"{node.name} without its unread optional output(s) {names}", 0, 0, kept=True))
    return rewrites

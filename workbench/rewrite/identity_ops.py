"""Rule ``identity_op`` (every level but "disabled"; inside If / Loop / Scan bodies at the
fusion levels, before the fusions there): nodes that hand their input on unchanged.

What it rewrites: an Identity, and a Cast to the dtype its input already has (torch.onnx's
exporters write ``Cast(to=float)`` of a float32 value around every RMS norm and rotary
table: the mixed-precision form, kept in a float32 export), is removed and its readers read
its input instead. onnxruntime's basic level does the same (its identity and cast
eliminations). Besides the dispatch each one costs at every step, such a Cast stands
between the ops of a chain a fusion would otherwise recognise (`rms_norm`).

When it applies: the node is in the default domain and has no subgraph; a Cast's input
has a known dtype equal to its `to` (so its `saturate`, which concerns float8 targets
only, changes nothing); the output is not a graph output (its name is the caller's) nor
read by a subgraph (a body names what it captures; the rewiring here is by value).

The invariant: Identity's output is its input, and a Cast to the value's own dtype is
exact, so every reader sees the same values; where their arrays live is the executor's
business, decided from the rewritten graph as from any other.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import numpy_dtype
from ..ir.graph import Graph, Node
from .graph_edit import Rewrite, is_plain, readers, rewired


def drop_identity_ops(graph: Graph) -> list[Rewrite]:
    """Remove from `graph` every node `_hands_on` accepts, its readers rewired to its input."""
    outputs = set(graph.outputs)
    read_by = readers(graph)
    through: dict[int, int] = {}  # a removed node's output -> the value it handed on
    rewrites = []
    kept = []
    for node in graph.nodes:
        if _hands_on(graph, node, outputs, read_by):
            through[node.outputs[0]] = node.inputs[0]
            rewrites.append(Rewrite("identity_op", (node.name,), (node.op_type,), "", 1, 0))
        else:
            kept.append(node)
    if not through:
        return []
    for out, source in through.items():  # a chain of them reads its first one's input
        while source in through:
            source = through[source]
        through[out] = source
    graph.nodes = [rewired(n, through) for n in kept]
    return rewrites


def _hands_on(graph: Graph, node: Node, outputs: set, read_by: dict) -> bool:
    """Whether `node` passes its one input on unchanged and may be removed."""
    if not is_plain(node, "Identity", "Cast") or len(node.inputs) != 1 or len(node.outputs) != 1:
        return False
    source, out = node.inputs[0], node.outputs[0]
    if source < 0 or out < 0 or out in outputs or any(pos < 0 for _, pos in read_by.get(out, [])):
        return False
    if node.op_type == "Identity":
        return graph.values[out].kind == graph.values[source].kind
    dtype = graph.values[source].dtype
    return dtype is not None and graph.values[source].kind == "tensor" and _cast_target(node) == dtype


def _cast_target(node: Node) -> np.dtype | None:
    try:
        return numpy_dtype(int(node.attrs["to"]))
    except (KeyError, ValueError, TypeError):  # no or no valid `to`: the kernel says so at run time
        return None


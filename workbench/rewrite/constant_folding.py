"""Rule ``constant_folding`` (every level but "disabled"): a node computed once, at load.

What it rewrites: a node whose inputs are all initializers (or omitted) runs here,
and its outputs become initializers; the node leaves the graph. Tied embeddings read
`Transpose(lm_head)`: folded, the Gather reads a contiguous table instead of a
strided 100 MB view every step.

When it applies: the op is deterministic (no Random*, Bernoulli, Multinomial), has no
subgraph and reads nothing from an enclosing scope, makes tensors only, none of them a
graph output, has a native kernel (a host fallback is left to run time, where it is
reported), and its results are at most `_GROWTH` times its inputs' bytes (plus a
little): a small ConstantOfShape / Expand must not become a big resident tensor.

The invariant: such a node's outputs are a function of its inputs alone, and those
are weights the caller never feeds (`Graph.inputs` excludes initializers), so every
run would compute the same arrays. They are computed by
the workbench's own kernel for the op, built from the same `NodeInfo` the plan gives
it (`kernel_info`), and stored in the value's declared dtype as a fresh C-contiguous
array (never a view of another weight), so a folded value is the value the unfolded
graph computes. A kernel that raises here is left in place, to fail at run time with
its node named.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.graph import Graph, Node
from ..ops import registry
from .graph_edit import Rewrite, in_bodies
from .kernel_info import node_info
from .unused_initializers import drop_unused_initializers

#: ops whose value is not a function of their inputs
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                               "Bernoulli", "Multinomial"})
#: a folded result may be at most this many times its inputs' bytes (plus a little):
#: folding must not turn a small ConstantOfShape / Expand into a big resident tensor
_GROWTH, _SLACK_BYTES = 4, 1 << 16


def fold_constants(graph: Graph) -> list[Rewrite]:
    rewrites = []
    graph_outputs = set(graph.outputs)
    kept = []
    for node in graph.nodes:
        folded = _fold(graph, node) if _foldable(graph, node, graph_outputs) else None
        if folded is None:
            kept.append(node)
            continue
        for vid, array in folded.items():
            graph.initializers[vid] = array
            v = graph.values[vid]
            graph.values[vid] = dataclasses.replace(v, dtype=array.dtype, shape=tuple(array.shape))
        names = ", ".join(graph.values[v].name for v in folded)
        rewrites.append(Rewrite("constant_folding", (node.name,), (node.op_type,), names, 1,
                                sum(a.nbytes for a in folded.values())))
    graph.nodes = kept
    return rewrites


def fold_constants_in_bodies(graph: Graph) -> list[Rewrite]:
    """The rule inside every If / Loop / Scan body, nested ones too (on copies: the
    loaded graph stays as it was). A body's Constant nodes, and the nodes reading only
    them, become that body's initializers; a body re-runs them every time it runs
    (optimum's merged decoder holds the whole model in an If: GPT-2's branch has 220
    Constant nodes). A value a body reads from an enclosing scope is not one of its
    initializers, so nothing reading one folds."""

    def rewrite_body(copy: Graph, here, consts: dict) -> list[Rewrite]:
        found = fold_constants(copy)
        if found:  # what only the folded nodes read (a chain's first links), as at the top level
            found += drop_unused_initializers(copy, None)
        return found + in_bodies(copy, here, rewrite_body)

    return in_bodies(graph, None, rewrite_body)


def _foldable(graph: Graph, node: Node, outputs: set[int]) -> bool:
    if node.subgraphs or node.outer_reads or node.op_type in _NONDETERMINISTIC:
        return False
    if not all(i < 0 or i in graph.initializers for i in node.inputs):
        return False
    outs = [o for o in node.outputs if o >= 0]
    return bool(outs) and not any(o in outputs for o in outs) and all(
        graph.values[o].kind == "tensor" for o in outs)


def _fold(graph: Graph, node: Node) -> dict[int, np.ndarray] | None:
    """Run the node's own kernel on its initializers; None when that is not possible
    or not worth it."""
    ins = [graph.initializers[i] if i >= 0 else None for i in node.inputs]
    folded = evaluate(graph, node, ins)
    budget = _GROWTH * sum(a.nbytes for a in ins if a is not None) + _SLACK_BYTES
    if folded is None or sum(a.nbytes for a in folded.values()) > budget:
        return None
    return folded


def evaluate(graph: Graph, node: Node, inputs: list) -> dict[int, np.ndarray] | None:
    """Output value id -> the array the node's own kernel computes from `inputs` (numpy
    arrays, None where omitted), in each value's declared dtype, a fresh C-contiguous
    array; None when the op has no native kernel, or the kernel fails (it fails at run
    time then, with its node named)."""
    info = node_info(graph, node, np, None)
    spec = registry.find_native(info)
    if spec is None:
        return None  # the host fallback: leave it to run time, where it is reported
    try:
        results = spec.build(info)(list(inputs), [None] * len(node.outputs))
    except Exception:  # noqa: BLE001 - a kernel that fails here fails at run time, with its node named
        return None
    folded: dict[int, np.ndarray] = {}
    for vid, r in zip(node.outputs, results):
        if vid < 0:
            continue
        if not isinstance(r, np.ndarray):
            return None
        v = graph.values[vid]
        if v.dtype is not None and r.dtype != v.dtype:
            r = r.astype(v.dtype)
        folded[vid] = np.array(r, order="C", copy=True)  # never a view of another weight (and 0-d stays 0-d)
    return folded

"""The MatMul weight rules inside If branches (level "extended" / "all").

optimum's merged decoder runs its whole model inside `If(use_cache_branch)`; the
weights are outer-graph initializers both branches read. The rules that rewrite a
weight for one-token products (sibling fusion, padding past OpenBLAS's threading
threshold, column-major layout, huge pages) look for weights that MatMuls alone read
in the graph they run on, so they never saw these: on the small llama the merged
decoder's step ran 43 separate row-major products where the same graph unmerged runs
25 fused column-major ones.

How: in a copy of each branch, the outer initializers it reads become its own (the
same arrays: nothing is copied), the rules run on the copy as on a top-level graph,
and the If stops capturing what its branches now hold. The invariant: a branch's own
initializers are the very arrays its outer names resolved to, so each weight rule
keeps its own invariant there as at the top level. Both branches rewrite the same
arrays alike, and `weight_sharing` hands the second the very arrays the first got, so
each rewritten weight is in memory once; the outer originals, read by nothing now, go
when the If no longer captures them. Only an If of the top-level graph is taken (a
name its branches read then resolves in that graph; no feed can replace an
initializer there: the session refuses one named like it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..ir.graph import Graph
from .graph_edit import Rewrite, copy_graph
from .weight_sharing import sharing_weights

#: the rules run on a branch copy whose weights it now holds
BranchRules = Callable[[Graph], list[Rewrite]]


def rewrite_branch_weights(graph: Graph, rules: BranchRules) -> list[Rewrite]:
    """`rules` on a copy of every branch of each If in `graph` (edited in place: the If
    nodes get the copies that changed, and capture less)."""
    rewrites: list[Rewrite] = []
    with sharing_weights():
        for i, node in enumerate(graph.nodes):
            if node.op_type != "If" or node.domain or not node.subgraphs:
                continue
            changed = {}
            for attr, body in node.subgraphs.items():
                copy = copy_graph(body)
                if not _hoist_weights(graph, copy):
                    continue
                found = rules(copy)
                if found:
                    copy.nodes = [dataclasses.replace(n, index=k) for k, n in enumerate(copy.nodes)]
                    changed[attr] = copy
                    rewrites += found
            if changed:
                branches = {**node.subgraphs, **changed}
                read = {b.values[v].name for b in branches.values() for v in b.outer_inputs}
                outer_reads = tuple(v for v in node.outer_reads if graph.values[v].name in read)
                graph.nodes[i] = dataclasses.replace(node, subgraphs=branches, outer_reads=outer_reads)
    return rewrites


def _hoist_weights(graph: Graph, branch: Graph) -> bool:
    """The outer initializers `branch` reads become its own initializers (same arrays);
    whether there were any."""
    kept = []
    for vid in branch.outer_inputs:
        outer = graph.by_name.get(branch.values[vid].name)
        if outer is None or outer not in graph.initializers:
            kept.append(vid)
            continue
        array = graph.initializers[outer]
        branch.initializers[vid] = array
        branch.values[vid] = dataclasses.replace(branch.values[vid], dtype=array.dtype, shape=tuple(array.shape))
    hoisted = len(kept) != len(branch.outer_inputs)
    branch.outer_inputs = kept
    return hoisted

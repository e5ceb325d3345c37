"""Load-time graph rewrites, levels as onnxruntime names them, each one recorded.

`optimize(graph, level)` returns a new `Graph` (the loaded one stays as it was) and
the list of `Rewrite`s it made, so a user sees what ran differently from the model
file and why:

- ``constant_folding``: a node whose inputs are all initializers runs once, here; its
  outputs become initializers. Tied embeddings read `Transpose(lm_head)`: folded,
  the Gather reads a contiguous table instead of a strided 100 MB view every step.
- ``dead_node``: a node none of whose outputs is read (after folding, or in the file).
- ``unused_initializer``: weights nothing reads any more, released.
- ``matvec_layout`` (level ``all``): weights only MatMul reads as B stored column-major,
  the layout one-token matrix-vector products read fastest (on the CPU, a wide one
  may be kept row-major, which some machines' OpenBLAS reads faster: `wide_layout`).
- ``matvec_threads`` (level ``all``, `matvec_threads.py`): a weight just under OpenBLAS's
  threading threshold padded with zero columns past it, a Slice taking the real ones.
- ``nbits_dequantized`` (level ``all``, `nbits_dequantized.py`): a MatMulNBits over
  constant weights as a MatMul over them dequantized once (what its kernel multiplies
  by anyway), before the MatMul rules, which then take it as a float model's product.
- ``huge_pages`` (level ``all``, cpu, `huge_pages.py`): MatMul weights in memory backed
  by 2 MiB pages; the rules above write theirs there directly.

Levels (named as onnxruntime's `GraphOptimizationLevel`): ``disabled``; ``basic``
makes the rewrites above; ``extended`` and ``all`` also fold shape arithmetic at run
time on decode-plan memo replays (`memo.shape_fold_nodes`: Shape -> Gather ->
Unsqueeze -> Concat chains over invariant shapes, served from the reference step).
``extended`` and ``all`` also run the fusion rules (`rewrite.fusion`): several nodes
replaced by fewer, faster ones computing the same values.
Folding uses the workbench's own kernels, the ones a run would use, so a folded
value is the value the unfolded graph computes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node
from ..ops import registry
from .branch_weights import BranchRules, rewrite_branch_weights
from .fusion import fuse, fuse_sibling_matmuls
from .graph_edit import Rewrite, copy_graph, matmul_weights, read_values, replace_weight, weight_rewrite
from .huge_pages import (
    WeightArena,
    huge_pages_available,
    move_matvec_weights,
    new_weight,
    placing_weights,
    write_weight,
)
from .kernel_info import node_info
from .matvec_threads import matvec_order, pad_for_threads
from .nbits_dequantized import dequantize_nbits_weights
from .weight_sharing import once
from .wide_layout import DEFAULT_WIDE_WEIGHT_LAYOUT, wide_weight_layout

#: the graph optimization levels (`SessionOptions.graph_optimization_level`), as onnxruntime names them
LEVELS = ("disabled", "basic", "extended", "all")
__all__ = ["LEVELS", "Rewrite", "check_level", "optimize", "rewrite_rows"]

#: ops whose value is not a function of their inputs
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                               "Bernoulli", "Multinomial"})
#: a folded result may be at most this many times its inputs' bytes (plus a little):
#: folding must not turn a small ConstantOfShape / Expand into a big resident tensor
_GROWTH, _SLACK_BYTES = 4, 1 << 16


def check_level(level: str) -> str:
    text = str(level).strip().lower()
    if text not in LEVELS:
        raise ValueError(f"graph_optimization_level must be one of {LEVELS}, got {level!r}")
    return text


def optimize(graph: Graph, level: str, *, release: bool = False, backend: str = "cpu",
             wide_weights: str = DEFAULT_WIDE_WEIGHT_LAYOUT) -> tuple[Graph, list[Rewrite]]:
    """The rewritten graph and what was rewritten. The input graph is not changed,
    except that with `release` its references to weights the rewrite replaced are
    dropped as it goes (so a relaid weight's original can be freed at once, and load
    never holds two copies of the model). `backend` names the backend that will run it
    (rules tuned to the CPU's BLAS make only for "cpu"); `wide_weights` the order of a
    wide MatMul weight at level "all" (`wide_layout`)."""
    # what loading assumed or could not do comes first, at every level (kept: nothing changed)
    notes = [Rewrite(rule=n.rule, original_nodes=n.nodes, original_ops=n.ops, result=n.detail, nodes_saved=0,
                     bytes_delta=0, kept=True) for n in graph.load_notes]
    if check_level(level) == "disabled":
        return graph, notes
    out = copy_graph(graph)
    rewrites = notes + _fold_constants(out)
    rewrites += _drop_dead_nodes(out)
    released = graph.initializers if release else None
    rewrites += _drop_unused_initializers(out, released)
    # the weights level "all" writes for numpy's BLAS go straight into huge pages
    arena = WeightArena() if level == "all" and backend == "cpu" and huge_pages_available() else None
    with placing_weights(arena), wide_weight_layout(wide_weights):
        if level == "all":  # before the MatMul rules, which then take these products too
            rewrites += dequantize_nbits_weights(out)
            rewrites += _drop_unused_initializers(out, released)  # the packed weights they read
        if level in ("extended", "all"):
            rewrites += fuse(out, released, level)
        if level == "all":
            if backend == "cpu":  # numpy's BLAS threading; cuBLAS has no such threshold
                rewrites += pad_for_threads(out, released)
            rewrites += _matvec_layout(out, released, backend)
        if level in ("extended", "all"):  # the weights an If's branches read (optimum's merged decoder)
            rewrites += rewrite_branch_weights(out, _branch_weight_rules(level, backend, arena))
            # the outer originals the branches now hold: no rows (their bytes live on in
            # the branches, or the branches' rows account for them)
            _drop_unused_initializers(out, released)
    if arena is not None:
        rewrites += move_matvec_weights(out, arena, released)
    out.nodes = [dataclasses.replace(n, index=i) for i, n in enumerate(out.nodes)]
    return out, rewrites


def _foldable(graph: Graph, node: Node, outputs: set[int]) -> bool:
    if node.subgraphs or node.captures or node.op_type in _NONDETERMINISTIC:
        return False
    if not all(i < 0 or i in graph.initializers for i in node.inputs):
        return False
    outs = [o for o in node.outputs if o >= 0]
    return bool(outs) and not any(o in outputs for o in outs) and all(
        graph.values[o].kind == "tensor" for o in outs)


def _fold_constants(graph: Graph) -> list[Rewrite]:
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


def _fold(graph: Graph, node: Node) -> dict[int, np.ndarray] | None:
    """Run the node's own kernel on its initializers; None when that is not possible
    or not worth it."""
    info = node_info(graph, node, np, None)
    spec = registry.find_native(info)
    if spec is None:
        return None  # the host fallback: leave it to run time, where it is reported
    ins = [graph.initializers[i] if i >= 0 else None for i in node.inputs]
    try:
        results = spec.build(info)(ins, [None] * len(node.outputs))
    except Exception:  # noqa: BLE001 - a kernel that fails here fails at run time, with its node named
        return None
    budget = _GROWTH * sum(a.nbytes for a in ins if a is not None) + _SLACK_BYTES
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
    if sum(a.nbytes for a in folded.values()) > budget:
        return None
    return folded


def _matvec_layout(graph: Graph, release: dict | None, backend: str = "cpu") -> list[Rewrite]:
    """Weights only MatMul reads as B, stored column-major (same values, same shape).

    One-token decode is matrix-vector work bound by memory bandwidth; with B
    column-major, BLAS walks each output's weights contiguously (measured on this
    project's 2-core machine: 1536x512 matvec 74 -> 20 us, 512x1536 39 -> 29 us; the
    largest, bandwidth-bound, unchanged). Prefill's matrix products get slower (up to
    about 1.5x), a one-time cost per prompt. The summation order changes with the
    layout, so results move within float rounding (level "all" only); a model gives the
    same bits whether its weights are embedded or in external data (both are relaid).
    On the cpu backend with a multithreaded OpenBLAS a wide weight stays row-major where
    the setting asks for it (`wide_layout`)."""
    rewrites = []
    for vid, uses in matmul_weights(graph):
        array = graph.initializers[vid]
        if (array.dtype not in (np.float32, np.float64) or array.shape[0] < 2 or array.shape[1] < 2
                or array.flags.f_contiguous or matvec_order(*array.shape, backend) == "C"):
            continue
        relaid = once(("matvec_layout",), (array,), _column_major, array)  # one for both If branches
        del array
        replace_weight(graph, vid, relaid, release)
        rewrites.append(weight_rewrite("matvec_layout", graph, vid, uses))
    return rewrites


def _column_major(array: np.ndarray) -> np.ndarray:
    relaid = new_weight(array.shape, array.dtype, "F")
    write_weight(relaid, array)
    return relaid


def _branch_weight_rules(level: str, backend: str, arena: WeightArena | None) -> BranchRules:
    """The weight rules as they run on the top-level graph, for an If branch holding
    its weights (`branch_weights`)."""

    def rules(branch: Graph) -> list[Rewrite]:
        found = fuse_sibling_matmuls(branch, None, level)
        if level == "all":
            if backend == "cpu":
                found += pad_for_threads(branch, None)
            found += _matvec_layout(branch, None, backend)
            if arena is not None:
                found += move_matvec_weights(branch, arena, None)
        return found

    return rules


def _drop_dead_nodes(graph: Graph) -> list[Rewrite]:
    rewrites = []
    while True:
        read = read_values(graph)
        dead = [n for n in graph.nodes if not any(o >= 0 and o in read for o in n.outputs)]
        if not dead:
            return rewrites
        gone = {id(n) for n in dead}
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
        rewrites += [Rewrite("dead_node", (n.name,), (n.op_type,), "", 1, 0) for n in dead]


def _drop_unused_initializers(graph: Graph, release: dict | None) -> list[Rewrite]:
    read = read_values(graph)
    unused = [vid for vid in graph.initializers if vid not in read]
    rewrites = []
    for vid in unused:
        array = graph.initializers.pop(vid)
        if release is not None:
            release.pop(vid, None)  # the loaded graph's reference too: its memory goes now
        rewrites.append(Rewrite("unused_initializer", (), (), graph.values[vid].name, 0, -array.nbytes))
    return rewrites


def rewrite_rows(rewrites: list[Rewrite]) -> list[dict[str, Any]]:
    """One row per rewrite, for the recording's `rewrites` table."""
    return [{"rule": r.rule, "original_nodes": list(r.original_nodes), "original_ops": list(r.original_ops),
             "result": r.result, "nodes_saved": r.nodes_saved, "bytes_delta": r.bytes_delta, "kept": r.kept}
            for r in rewrites]

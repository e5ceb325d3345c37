"""The load-time rewrite driver: levels as onnxruntime names them, each change recorded.

`optimize(graph, level)` returns a new `Graph` (the loaded one stays as it was) and
the list of `Rewrite`s it made, so a user sees what runs differently from the model
file and why. The rules, in the order they run (each in its own module, whose
docstring says what it rewrites and why the values stay the same):

- level ``basic`` and up: ``constant_folding``, ``identity_op``, ``dead_node``,
  ``unread_output``, ``unused_initializer``;
- level ``all``: ``nbits_dequantized`` (before the MatMul rules, which then take those
  products as a float model's);
- levels ``extended`` and ``all``: ``layout_round_trip``, then the fusion rules, in
  `fusion.RULES`' order;
- level ``all``: ``matvec_threads`` (cpu), ``matvec_layout``;
- levels ``extended`` and ``all``: the weight rules again inside If branches
  (``branch_weights``);
- level ``all``, cpu, where the kernel gives huge pages: ``huge_pages`` (the rules
  above write their weights there directly while `placing_weights` is in effect).

``extended`` and ``all`` also fold shape arithmetic at run time on decode-plan memo
replays (`executor.memo.shape_fold_nodes`); that is the executor's, decided per step.

The invariant every rule keeps: the rewritten graph computes the loaded graph's
outputs, exactly or (where a rule changes a summation order: fusions, weight
layouts, level "all") to float rounding. The rules read only the graph and its
weights, never a run, so they can all run once, here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.graph import Graph
from .branch_weights import BranchRules, rewrite_branch_weights
from .constant_folding import fold_constants, fold_constants_in_bodies
from .dead_nodes import drop_dead_nodes
from .fusion import fuse, fuse_sibling_matmuls
from .graph_edit import Rewrite, copy_graph
from .huge_pages import WeightArena, huge_pages_available, move_matvec_weights, placing_weights
from .identity_ops import drop_identity_ops
from .layout_round_trips import drop_layout_round_trips
from .matvec_layout import relay_matvec_weights
from .matvec_threads import pad_for_threads
from .nbits_dequantized import dequantize_nbits_weights
from .unread_outputs import drop_unread_outputs
from .unused_initializers import drop_unused_initializers
from .wide_layout import DEFAULT_WIDE_WEIGHT_LAYOUT, wide_weight_layout

#: the graph optimization levels (`SessionOptions.graph_optimization_level`), as onnxruntime names them
LEVELS = ("disabled", "basic", "extended", "all")
__all__ = ["LEVELS", "Rewrite", "check_level", "optimize", "rewrite_rows"]


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
    rewrites = notes + fold_constants(out) + fold_constants_in_bodies(out)
    rewrites += drop_identity_ops(out)
    rewrites += drop_dead_nodes(out)
    rewrites += drop_unread_outputs(out)
    released = graph.initializers if release else None
    rewrites += drop_unused_initializers(out, released)
    # the weights level "all" writes for numpy's BLAS go straight into huge pages
    arena = WeightArena() if level == "all" and backend == "cpu" and huge_pages_available() else None
    with placing_weights(arena), wide_weight_layout(wide_weights):
        if level == "all":  # before the MatMul rules, which then take these products too
            rewrites += dequantize_nbits_weights(out)
            rewrites += drop_unused_initializers(out, released)  # the packed weights they read
        if level in ("extended", "all"):
            rewrites += drop_layout_round_trips(out)  # first: what is left may be a chain a fusion knows
            rewrites += fuse(out, released, level)
        if level == "all":
            if backend == "cpu":  # numpy's BLAS threading; cuBLAS has no such threshold
                rewrites += pad_for_threads(out, released)
            rewrites += relay_matvec_weights(out, released, backend)
        if level in ("extended", "all"):  # the weights an If's branches read (optimum's merged decoder)
            rewrites += rewrite_branch_weights(out, _branch_weight_rules(level, backend, arena))
            # the outer originals the branches now hold: no rows (their bytes live on in
            # the branches, or the branches' rows account for them)
            drop_unused_initializers(out, released)
    if arena is not None:
        rewrites += move_matvec_weights(out, arena, released)
    out.nodes = [dataclasses.replace(n, index=i) for i, n in enumerate(out.nodes)]
    return out, rewrites


def _branch_weight_rules(level: str, backend: str, arena: WeightArena | None) -> BranchRules:
    """The weight rules as they run on the top-level graph, for an If branch holding
    its weights (`branch_weights`)."""

    def rules(branch: Graph) -> list[Rewrite]:
        found = fuse_sibling_matmuls(branch, None, level)
        if level == "all":
            if backend == "cpu":
                found += pad_for_threads(branch, None)
            found += relay_matvec_weights(branch, None, backend)
            if arena is not None:
                found += move_matvec_weights(branch, arena, None)
        return found

    return rules


def rewrite_rows(rewrites: list[Rewrite]) -> list[dict[str, Any]]:
    """One row per rewrite, for the recording's `rewrites` table."""
    return [{"rule": r.rule, "original_nodes": list(r.original_nodes), "original_ops": list(r.original_ops),
             "result": r.result, "nodes_saved": r.nodes_saved, "bytes_delta": r.bytes_delta, "kept": r.kept}
            for r in rewrites]

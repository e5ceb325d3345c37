"""The fusion rules (graph optimization levels ``extended`` and ``all``), in the order they run.

A fusion replaces several nodes of the loaded graph with fewer that compute the same
values (to float rounding: a fused kernel may sum in another order, as onnxruntime's
fusions do), and is recorded as a `Rewrite` naming every node it replaced. Each rule
is its own module, whose docstring says what it matches and why the value stays:

- ``matmul_siblings`` (`matmul_siblings`): MatMuls of one input as one MatMul + Split;
- ``nbits_siblings`` (`nbits_siblings`): the same for MatMulNBits computed in int8;
- ``layer_norm``, ``rms_norm``, ``gelu``, ``silu`` (`fusion_patterns`, one module each):
  elementwise chains as one node; one-token decode pays per node dispatched, and each
  saves 1 to 8 nodes a pattern; then the same four inside If / Loop / Scan bodies;
- ``attention`` (`fusion_attention`): repeat_kv, scores, mask, Softmax and the product
  with V as one ai.workbench MaskedSoftmaxAttention (no copy of the KV cache per head;
  also in bodies).

`RULES` runs in order; each rule takes the graph being rewritten (edited in place),
`release` (the loaded graph's initializers when the caller wants replaced weights
dropped as it goes, so load never holds the model twice) and the level.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph
from . import fusion_attention, fusion_patterns
from .graph_edit import Rewrite
from .matmul_siblings import fuse_sibling_matmuls
from .nbits_siblings import fuse_sibling_nbits

__all__ = ["RULES", "fuse", "fuse_sibling_matmuls"]


def fuse(graph: Graph, release: dict | None, level: str) -> list[Rewrite]:
    rewrites: list[Rewrite] = []
    for rule in RULES:
        rewrites += rule(graph, release, level)
    return rewrites


RULES: list[Callable[[Graph, dict | None, str], list[Rewrite]]] = [fuse_sibling_matmuls, fuse_sibling_nbits,
                                                                    *fusion_patterns.RULES,
                                                                    *fusion_attention.RULES]

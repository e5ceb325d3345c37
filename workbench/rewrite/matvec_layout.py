"""Rule ``matvec_layout`` (level "all"): MatMul weights stored column-major.

What it rewrites: a 2-D float32 / float64 initializer that only MatMuls read, as B,
gets a column-major copy in place of its row-major one: the same values, the same
shape, another memory order. The MatMuls, and every node, stay as they were.

Why: one-token decode is matrix-vector work bound by memory bandwidth; with B
column-major, BLAS walks each output's weights contiguously (measured on this
project's 2-core machine: 1536x512 matvec 74 -> 20 us, 512x1536 39 -> 29 us; the
largest, bandwidth-bound, unchanged). Prefill's matrix products get slower (up to
about 1.5x), a one-time cost per prompt. On the cpu backend with a multithreaded
OpenBLAS a wide weight stays row-major where the setting asks for it
(`wide_layout`, decided by `matvec_threads.matvec_order`); a weight already
column-major, or with a dimension under 2, is left alone.

The invariant: a kernel reads an array by its strides, so a MatMul over the relaid
weight multiplies by the same matrix. Only the order BLAS sums each output's terms
in follows the layout, so results move within float rounding (hence level "all"
only); a model gives the same bits whether its weights are embedded or in external
data (both are relaid). The two branches of an If relay a shared weight once
(`weight_sharing`), and a relaid weight is written where `huge_pages` places it.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .graph_edit import Rewrite, matmul_weights, replace_weight, weight_rewrite
from .huge_pages import new_weight, write_weight
from .matvec_threads import matvec_order
from .weight_sharing import once


def relay_matvec_weights(graph: Graph, release: dict | None, backend: str = "cpu") -> list[Rewrite]:
    """Weights only MatMul reads as B, stored column-major (same values, same shape)."""
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

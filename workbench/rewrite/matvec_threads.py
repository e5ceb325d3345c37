"""Level "all": weights padded past OpenBLAS's threading threshold (rule `matvec_threads`).

OpenBLAS computes a matrix-vector product on one thread while m * n < 460,800
(115,200 times its GEMM_MULTITHREAD_THRESHOLD of 4). One-token decode streams every
weight from memory, so a weight just under that size runs at one core's bandwidth:
measured on this project's 2-core machine with weights out of cache, 576x790 at
10 GB/s and 576x810 at 20 GB/s; SmolLM2's 576x576 attention output projection 130 ->
95 us, thirty times a token.

The rule gives such a weight (read only by MatMul, as B) zero columns up to the first
width over the threshold and has a Slice take the real columns back: a zero-copy view,
contiguous for one token. The invariant: a zero column adds nothing to the others; each output is
still one dot product of the same row and column, so values move at most within the
float rounding of the BLAS kernel's blocking. Only where that pays: numpy's BLAS is
OpenBLAS with more than one thread, float32, and the padding adds at most 60%.

The zero columns cost no memory traffic: the padded weight is column-major, so they
are the tail of its buffer, and that tail is fresh anonymous memory never written
(`huge_pages.new_weight`). The kernel maps every page of such a tail to its one
shared zero page, which stays in cache, so a product streams the real weight's bytes
and no more. (`np.zeros` often gave the same, when the allocator took fresh pages from
the kernel for it; a heap reusing freed memory would have zeroed real pages instead.
Paired in-model runs measure no difference between the two today: 1.0015.)

Where the real columns would fall mostly to one of OpenBLAS's two threads (it gives
the first ceil(width / 2) outputs: 401 of SmolLM2's 576), they are split in two
halves instead, the second starting on a page boundary near the middle, with zero
pages between them and after (`balanced_halves`), in 4 KiB pages of their own
(`huge_pages.zero_tail_array`); two Slices and a Concat take the real outputs back,
a copy of 576 floats. SmolLM2's captured fixed-KV launch list, its 30 projections
laid out so against tail-padded, one process, 60 rounds alternating: 24.00 against
24.28 ms a step (paired median ratio 0.973); the projection alone, weights out of
cache: 81 against 105 us before the copy, 92 with it.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from ..ir.graph import Graph
from .graph_edit import Rewrite, add_initializer, add_value, make_node, matmul_weights
from .huge_pages import new_weight, write_weight, zero_tail_array
from .weight_sharing import made_before, once
from .wide_layout import wide_weights_row_major

#: OpenBLAS's sgemv runs single-threaded below this many matrix elements
SINGLE_THREAD_BELOW = 460_800
#: the most a padded weight may grow (bytes streamed per product, for twice the bandwidth)
MAX_GROWTH = 1.6
_PAGE = 4096
#: a weight with at least this many times as many columns as rows is "wide": the order it
#: is read fastest in depends on the machine (`wide_layout`)
WIDE = 1.5


def is_wide(rows: int, cols: int) -> bool:
    """Whether a rows x cols MatMul weight is wide: over OpenBLAS's threading threshold,
    with at least `WIDE` times as many columns as rows. Level "all" stores every weight
    column-major unless `wide_weight_layout` keeps the wide ones row-major, which one of
    this project's machines read faster and another slower (`wide_layout`)."""
    return rows * cols >= SINGLE_THREAD_BELOW and cols >= WIDE * rows


def openblas_threads_available() -> bool:
    """Whether numpy's BLAS is OpenBLAS and may use more than one thread."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = str(blas.get("name", "")) + str(blas.get("openblas configuration", ""))
    except Exception:  # noqa: BLE001 - an unusual numpy build: no padding
        return False
    if "openblas" not in name.lower():
        return False
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var):  # OpenBLAS reads the first one set
            return os.environ[var].strip() not in ("0", "1")
    return len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) > 1


def matvec_order(rows: int, cols: int, backend: str = "cpu") -> str:
    """The memory order level "all" gives a rows x cols MatMul weight (rule
    `matvec_layout`): "C" for a wide weight on a multithreaded OpenBLAS where the
    setting keeps them row-major (`wide_layout`), else "F"."""
    return "C" if backend == "cpu" and is_wide(rows, cols) and openblas_threads_available() \
        and wide_weights_row_major() else "F"


def padded_width(rows: int, cols: int) -> int | None:
    """The width to pad a rows x cols float32 weight to, or None when it should stay."""
    if rows * cols >= SINGLE_THREAD_BELOW:
        return None
    width = SINGLE_THREAD_BELOW // rows + 1
    return width if width <= MAX_GROWTH * cols else None


def balanced_halves(rows: int, cols: int, width: int) -> tuple[int, int] | None:
    """(columns in the first half, where the second half starts) of a column-major
    rows x width float32 padding whose real columns are split between OpenBLAS's two
    threads, else None. Its sgemv gives the first thread the first ceil(width / 2)
    outputs: with the real columns all at the front, that thread streams 401 of
    SmolLM2's 576 and the other 175. Here the second half starts on a 4 KiB page
    boundary at or just before that split, so the zero columns between the halves
    are whole pages never written (the shared zero page, like the tail)."""
    first = cols - cols // 2
    per_page = _PAGE // math.gcd(rows * 4, _PAGE)  # columns from one page boundary to the next
    second = (width + 1) // 2 // per_page * per_page
    if second <= first or second + cols // 2 > width:  # no gap to balance, or no room
        return None
    return first, second


def _padded(array: np.ndarray, width: int) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """`array` with zero columns up to `width`, and the (start, end) column ranges its
    real columns occupy: the front, or two halves (`balanced_halves`)."""
    rows, cols = array.shape
    order = matvec_order(rows, width)
    halves = balanced_halves(rows, cols, width) if order == "F" else None
    if halves is not None:  # the zero columns are whole pages in the middle and the tail, never written
        wide = zero_tail_array((rows, width), np.float32, order)
        first, second = halves
        write_weight(wide[:, :first], array[:, :first])
        write_weight(wide[:, second:second + cols - first], array[:, first:])
        return wide, ((0, first), (second, second + cols - first))
    if order == "F":  # the zero columns are the buffer's tail: never written, the zero page
        wide = new_weight((rows, width), np.float32, order, zero_tail=rows * (width - cols) * 4)
    else:
        wide = new_weight((rows, width), np.float32, order)
        wide[:, cols:] = 0
    write_weight(wide[:, :cols], array)
    return wide, ((0, cols),)


def pad_for_threads(graph: Graph, release: dict | None) -> list[Rewrite]:
    if not openblas_threads_available():
        return []
    rewrites: list[Rewrite] = []
    for vid, uses in matmul_weights(graph):
        array = graph.initializers[vid]
        if array.dtype != np.float32:
            continue
        rows, cols = array.shape
        width = padded_width(rows, cols)
        if width is None:
            continue
        key = ("matvec_threads", width)
        shared = made_before(key, (array,))  # by the other If branch: its bytes are counted there
        wide, pieces = once(key, (array,), _padded, array, width)
        name = graph.values[vid].name
        wide_id = add_initializer(graph, f"{name}_padded", wide)
        graph.initializers.pop(vid)
        if release is not None:
            release.pop(vid, None)
        del array
        axes = add_initializer(graph, f"{name}_slice_axes", np.array([-1], np.int64))
        bounds = [(add_initializer(graph, f"{name}_slice_starts", np.array([start], np.int64)),
                   add_initializer(graph, f"{name}_slice_ends", np.array([end], np.int64))) for start, end in pieces]
        by_node = {id(n): n for n, _ in uses}
        for node in by_node.values():
            y = node.outputs[0]
            v = graph.values[y]
            shape = None if v.shape is None else v.shape[:-1] + (width,)
            y_wide = add_value(graph, f"{v.name}_padded", v.dtype, shape)
            matmul = dataclasses.replace(node, inputs=(node.inputs[0], wide_id), outputs=(y_wide,))
            if len(pieces) == 1:
                tail = [make_node(graph, f"{node.name}/threads_slice", "Slice", [y_wide, *bounds[0], axes], [y])]
            else:
                halves_out = [add_value(graph, f"{v.name}_half{i}", v.dtype,
                                        None if v.shape is None else v.shape[:-1] + (end - start,))
                              for i, (start, end) in enumerate(pieces)]
                tail = [make_node(graph, f"{node.name}/threads_slice{i}", "Slice", [y_wide, *bounds[i], axes],
                                  [halves_out[i]]) for i in range(len(pieces))]
                tail.append(make_node(graph, f"{node.name}/threads_concat", "Concat", halves_out, [y], axis=-1))
            at = next(i for i, n in enumerate(graph.nodes) if n is node)
            graph.nodes[at:at + 1] = [matmul, *tail]
        rewrites.append(Rewrite("matvec_threads", tuple(n.name for n in by_node.values()),
                                tuple("MatMul" for _ in by_node), f"{name}_padded", 0,
                                0 if shared else wide.nbytes - rows * cols * 4, kept=True))
    return rewrites

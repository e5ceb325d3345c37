"""Zero-copy views at one step, and how a strided view walks its source buffer.

A view is (source owner, shape, element strides, byte offset): view element
``(i0, i1, ...)`` is source element ``offset + i0*s0 + i1*s1 + ...`` of the
source's flat buffer. `view_walk` lists those source elements in the view's own
(C) order -- the picture that makes strides click.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .plan import shapes_at_step
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["walk_of", "ITEMSIZE", "ViewWalk", "most_instructive_view", "view_walk", "views_at"]

#: bytes per element of the values table's dtype names
ITEMSIZE = {"float": 4, "float16": 2, "bfloat16": 2, "double": 8, "int64": 8, "uint64": 8, "int32": 4,
            "uint32": 4, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8,
            "complex128": 16, "float8e4m3fn": 1, "float8e5m2": 1}


def _dims(text: str) -> tuple | None:
    """'[1, 4, 7]' -> (1, 4, 7); None when any dim is still symbolic."""
    if not isinstance(text, str) or not text.startswith("["):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return ()
    try:
        return tuple(int(d) for d in inner.split(","))
    except ValueError:
        return None


def views_at(src: Recording | Frames, step: int) -> pd.DataFrame:
    """The views created at `step`, with what the teaching drawing needs.

    Columns: value, source, shape, strides, byte_offset, producer, op, plan_index,
    dtype, itemsize, element_offset, contiguous (strides are the row-major ones of
    the shape), source_shape (the source's shape at the step).
    """
    f = as_frames(src)

    def build() -> pd.DataFrame:
        v = f.get("views")
        v = v[v["step"] == step]
        values = f.get("values").set_index("name")
        shapes = shapes_at_step(f, step)
        dtype = [values["dtype"].get(s, "?") if s in values.index else "?" for s in v["source"]]
        item = [ITEMSIZE.get(d, 0) for d in dtype]
        out = v[["value", "source", "shape", "strides", "byte_offset", "producer", "op",
                 "plan_index"]].copy()
        out["dtype"] = dtype
        out["itemsize"] = item
        out["element_offset"] = [b // i if i else None for b, i in zip(out["byte_offset"], item)]
        out["contiguous"] = [tuple(st) == _row_major(sh) for sh, st in zip(out["shape"], out["strides"])]
        out["source_shape"] = [shapes.get(s, "?") for s in out["source"]]
        return out.reset_index(drop=True)

    return f.memo(("views_at", step), build)


def _row_major(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= int(d)
    return tuple(reversed(strides))


@dataclass
class ViewWalk:
    """Source elements a view touches, in the view's order, laid out on a grid.

    `order[k]` is the flat source index of the view's k-th element; the grid shows
    source elements `first_element .. first_element + rows*cols - 1` row by row
    (`cols` = the source's last dim when it has one that fits). `shown` counts how
    many of the view's elements fall inside the grid.
    """

    value: str
    source: str
    shape: tuple
    strides: tuple
    element_offset: int
    source_shape: tuple | None
    source_elements: int | None
    order: np.ndarray
    cols: int
    rows: int
    first_element: int
    truncated: bool
    notes: list[str] = field(default_factory=list)

    def grid(self) -> tuple[np.ndarray, np.ndarray]:
        """(first_visit, visits): per grid cell, the view position that first reads it
        (-1 = untouched) and how many view elements read it (broadcast strides of 0 > 1)."""
        n = self.rows * self.cols
        first = np.full(n, -1, dtype=np.int64)
        visits = np.zeros(n, dtype=np.int64)
        local = self.order - self.first_element
        inside = (local >= 0) & (local < n)
        pos = np.flatnonzero(inside)
        cells = local[inside]
        np.add.at(visits, cells, 1)
        # first visit: write positions in reverse so the earliest wins
        first[cells[::-1]] = pos[::-1]
        return first.reshape(self.rows, self.cols), visits.reshape(self.rows, self.cols)


def view_walk(src: Recording | Frames, step: int, value: str, max_cells: int = 2048,
              max_elements: int = 4096) -> ViewWalk | None:
    """How view `value` walks its source at `step` (None when it is not a view there)."""
    v = views_at(src, step)
    hit = v[v["value"] == value]
    if hit.empty:
        return None
    r = hit.iloc[0]
    notes: list[str] = []
    offset = r["element_offset"]
    if offset is None or pd.isna(offset):
        notes.append(f"unknown element size of dtype {r['dtype']!r}: byte offset {r['byte_offset']} "
                     "shown as an element offset")
        offset = int(r["byte_offset"])
    return walk_of(tuple(int(d) for d in r["shape"]), tuple(int(s) for s in r["strides"]), int(offset),
                   _dims(r["source_shape"]), value=r["value"], source=r["source"], max_cells=max_cells,
                   max_elements=max_elements, notes=notes)


def walk_of(shape, strides, element_offset: int = 0, source_shape=None, *, value: str = "view",
            source: str = "source", max_cells: int = 2048, max_elements: int = 4096,
            notes: list[str] | None = None) -> ViewWalk:
    """The `ViewWalk` of any strided view -- (shape, element strides, element offset) over a
    source of `source_shape` -- e.g. a numpy array's: `walk_of(t.shape, [s // t.itemsize
    for s in t.strides], 0, a.shape)`, drawn by `figures.view_walk_figure` as the widget does."""
    notes = list(notes or [])
    shape = tuple(int(d) for d in shape)
    strides = tuple(int(s) for s in strides)
    offset = int(element_offset)
    total = math.prod(shape)
    count = min(total, max_elements)
    if total > max_elements:
        notes.append(f"the view has {total:,} elements; its first {max_elements:,} are drawn")
    idx = np.unravel_index(np.arange(count), shape) if shape else ()
    order = np.full(count, offset, dtype=np.int64)
    for axis_idx, st in zip(idx, strides):
        order += axis_idx.astype(np.int64) * st
    src_shape = tuple(int(d) for d in source_shape) if source_shape is not None else None
    src_elements = math.prod(src_shape) if src_shape is not None else None
    cols = src_shape[-1] if src_shape else 0
    if not cols or cols > 64:
        span = int(order.max()) + 1 if count else 1
        cols = max(1, min(64, math.ceil(math.sqrt(max(src_elements or span, span)))))
    lo = int(order.min()) if count else 0
    first_row = lo // cols
    hi = int(order.max()) if count else 0
    rows = hi // cols - first_row + 1
    max_rows = max(1, max_cells // cols)
    truncated = rows > max_rows
    if truncated:
        rows = max_rows
        notes.append(f"source rows {first_row}..{first_row + rows - 1} of the touched range are drawn")
    return ViewWalk(value=value, source=source, shape=shape, strides=strides,
                    element_offset=offset, source_shape=src_shape, source_elements=src_elements,
                    order=order, cols=int(cols), rows=int(rows), first_element=int(first_row * cols),
                    truncated=truncated or total > max_elements, notes=notes)


def most_instructive_view(src: Recording | Frames, step: int) -> str | None:
    """The view at `step` whose walk over its source turns back most often (a transpose
    beats a reshape), ties broken by size; None when the step made no views."""
    v = views_at(src, step)
    if v.empty:
        return None
    best, best_key = None, None
    for r in v.itertuples(index=False):
        shape, strides = tuple(r.shape), tuple(r.strides)
        n = math.prod(shape)
        if n > 4096:
            key = (0, n)
        else:
            idx = np.unravel_index(np.arange(n), shape) if shape else ()
            order = sum((a.astype(np.int64) * s for a, s in zip(idx, strides)), np.zeros(n, np.int64))
            key = (int((np.diff(order) < 0).sum()), n)
        if best_key is None or key > best_key:
            best, best_key = r.value, key
    return best

"""ViewAliasView's model: views and in-place aliases at a step, and a view's walk."""

from __future__ import annotations

import pandas as pd

from ...reports import Frames, ViewWalk, most_instructive_view, view_walk, views_at
from ...reports.liveness import in_place_at

__all__ = ["ViewsModel", "explain_walk"]


class ViewsModel:
    def __init__(self, frames: Frames):
        self.frames = frames

    def views(self, step: int) -> pd.DataFrame:
        return views_at(self.frames, step)

    def aliases(self, step: int) -> pd.DataFrame:
        """Values stored in place at the step -- the same set Liveness draws as alias bars --
        and whether a node dispatched at this step made the write (`in_place_at`)."""
        return in_place_at(self.frames, step)

    def default_value(self, step: int) -> str | None:
        """The view the tab opens on: a Transpose that really reorders its source (what the
        text beside the drawing explains best), else the most instructive view."""
        v = self.views(step)
        best, best_key = None, None
        for r in v[v["op"] == "Transpose"].itertuples(index=False):
            shape, strides = tuple(r.shape), tuple(r.strides)
            moved = [s for n, s in zip(shape, strides) if n > 1]
            reorders = moved != sorted(moved, reverse=True)
            n = 1
            for d in shape:
                n *= int(d)
            key = (reorders, n <= 4096, -abs(n - 64))  # a small, legible reordering first
            if best_key is None or key > best_key:
                best, best_key = str(r.value), key
        return best if best is not None else most_instructive_view(self.frames, step)

    def value_for_node(self, step: int, plan_index: int) -> str | None:
        """The view that node `plan_index` produced at `step`, if it produced one."""
        v = self.views(step)
        hit = v[v["plan_index"] == plan_index]
        return str(hit["value"].iloc[0]) if not hit.empty else None

    def walk(self, step: int, value: str | None) -> ViewWalk | None:
        return view_walk(self.frames, step, value) if value else None


def explain_walk(w: ViewWalk) -> list[str]:
    """The walk in words, for the text beside the drawing."""
    terms = " + ".join(f"i{k}·{s}" for k, s in enumerate(w.strides)) or "0"
    lines = [
        f"{w.value} is a view of {w.source}: no bytes copied.",
        f"view element (i0, …, i{max(len(w.shape) - 1, 0)}) = source element {w.element_offset} + {terms}",
        f"shape {list(w.shape)}, strides {list(w.strides)} (elements), offset {w.element_offset} elements",
    ]
    if w.source_shape is not None:
        lines.append(f"source shape {list(w.source_shape)} ({w.source_elements:,} elements)")
    if any(s == 0 for s in w.strides):
        lines.append("a stride of 0 repeats the same source elements (broadcast): cells read ×N")
    if any(s < 0 for s in w.strides):
        lines.append("a negative stride walks the source backwards")
    return lines + w.notes

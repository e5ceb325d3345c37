"""PlanView's model: the plan at a step, paged and filtered, and one node's details."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...reports import Frames, declines_at, plan_at_step, shapes_at_step
from ...reports.plan import unknown_dims_at_step
from ...reports.units import fmt_us
from .glance import WARM_UP, warm_up_steps, with_glance_groups
from .paging import Page, page_of

__all__ = ["TABLE_COLUMNS", "PlanModel"]

#: what the plan table shows
TABLE_COLUMNS = ["plan_index", "name", "op_type", "kernel", "output_shapes", "mode", "duration_us", "timed",
                 "segment", "group"]


class PlanModel:
    """What PlanView renders at (step, slot); pure pandas."""

    def __init__(self, frames: Frames):
        self.frames = frames

    def plan(self, step: int, slot: str | None = None) -> pd.DataFrame:
        """Every node at `step` (see `reports.plan_at_step`), grouped as the other tabs
        name things (`glance.with_glance_groups`: "warm-up", a captured node's segment state)."""
        def build() -> pd.DataFrame:
            p = plan_at_step(self.frames, step, slot)
            s = slot if slot is not None else self._slot_of(step)
            return with_glance_groups(p, step in warm_up_steps(self.frames, s))

        return self.frames.memo(("glance_plan", step, slot), build)

    def _slot_of(self, step: int) -> str:
        steps = self.frames.get("steps")
        hit = steps.loc[steps["step"] == step, "slot"]
        return str(hit.iloc[0]) if len(hit) else "primary"

    def table(self, step: int, slot: str | None = None, query: str = "", page: int = 0,
              size: int = 25) -> Page:
        """One page of the plan table, filtered by `query` over name, op type, kernel, group."""
        return page_of(self.plan(step, slot)[TABLE_COLUMNS], page, size, query,
                       ["name", "op_type", "kernel", "group", "mode"])

    def page_of_node(self, step: int, slot: str | None, plan_index: int, size: int = 25) -> int:
        """The (unfiltered) table page that holds `plan_index`."""
        pos = self.plan(step, slot).index[self.plan(step, slot)["plan_index"] == plan_index]
        return int(pos[0]) // size if len(pos) else 0

    def node(self, step: int, slot: str | None, plan_index: int) -> dict[str, Any] | None:
        """Everything about one node at `step`: inputs and outputs with their shapes,
        kernel, what it did (mode, time), its segment or static capture verdict."""
        p = self.plan(step, slot)
        hit = p[p["plan_index"] == plan_index]
        if hit.empty:
            return None
        r = hit.iloc[0]
        shapes = shapes_at_step(self.frames, step)
        unknown = unknown_dims_at_step(self.frames, step)

        def shape_of(n: str) -> str:  # a "?" names its symbol: dynamic, shape inference could not name it
            u = unknown.get(n)
            return shapes.get(n, "?") + (f" (? = {', '.join(u)}: dynamic)" if u else "")
        seg = None if pd.isna(r["segment"]) else f"segment {int(r['segment'])} ({r['segment_kind']}, {r['segment_state']})"
        # why it ran eager at this step: the decline in force (a seam), or the warm-up
        decline = None
        if r["group"] == WARM_UP:
            decline = ("warm-up", "an eager warm-up step before capture: every node runs eagerly and its "
                                  "just-in-time shapes seed the graphs recorded at a later step")
        elif r["group"] == "eager seam":
            d = declines_at(self.frames, step, slot if slot is not None else self._slot_of(step))
            hit_d = d[d["plan_index"] == plan_index] if d is not None else None
            if hit_d is not None and len(hit_d):
                decline = (str(hit_d["reason"].iloc[0]), str(hit_d["detail"].iloc[0]))
        return {
            "plan_index": int(r["plan_index"]), "name": r["name"], "op_type": r["op_type"], "domain": r["domain"],
            "kernel": r["kernel"],
            "mode": r["mode"] + (f" by {r['elided_by']}" if r["elided_by"] else ""),
            "duration": fmt_us(r["duration_us"]) + (
                f", {r['timed']} (a replayed segment is timed as a whole; its nodes share it evenly)"
                if r["mode"] == "replayed" else ""),
            "inputs": [(n, shape_of(n)) for n in r["inputs"]],
            "outputs": [(n, shape_of(n)) for n in r["outputs"]],
            "group": r["group"], "segment": seg,
            "capture_supported": bool(r["capture_supported"]) if not pd.isna(r["capture_supported"]) else None,
            "capture_reason": None if pd.isna(r["capture_reason"]) else r["capture_reason"],
            "capture_detail": r["capture_detail"] or "",
            "produces_view": bool(r["produces_view"]),
            "decline": decline,
        }

    def options(self) -> list[tuple[str, int]]:
        """(label, plan index) for a node picker: "#12 MatMul /model/..."."""
        n = self.frames.get("nodes")
        return [(f"#{i} {o} {name}", int(i)) for i, o, name in zip(n["plan_index"], n["op_type"], n["name"])]

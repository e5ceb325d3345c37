"""SegmentationView's model: segments per step and slot, declines by reason, one seam."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...reports import Frames, by_reason, declines_at, segments_at, static_verdicts, steps_of_slot
from .glance import warm_up_steps, with_warm_up_states
from .paging import Page, page_of

__all__ = ["SegmentationModel"]


class SegmentationModel:
    """What SegmentationView renders; `recorded` is False when the recording has no
    capture segmentation -- then only the plan's static verdicts can be shown."""

    def __init__(self, frames: Frames):
        self.frames = frames

    @property
    def recorded(self) -> bool:
        return self.frames.optional("segments") is not None

    def segments_per_step(self, slot: str) -> pd.DataFrame | None:
        """The segment plan in force at every recorded step of `slot` (None when not recorded)."""
        if not self.recorded:
            return None

        def build() -> pd.DataFrame:
            parts = []
            for s in steps_of_slot(self.frames, slot):
                seg = segments_at(self.frames, s, slot)
                if seg is not None and not seg.empty:
                    parts.append(seg.assign(step=s))
            out = pd.concat(parts, ignore_index=True) if parts else segments_at(self.frames, -1, slot)
            return with_warm_up_states(out, warm_up_steps(self.frames, slot))

        return self.frames.memo(("segments_per_step", slot), build)

    def segments(self, step: int, slot: str) -> pd.DataFrame | None:
        return segments_at(self.frames, step, slot)

    def declines(self, step: int, slot: str) -> pd.DataFrame | None:
        """Declines in force at `step` (None when not recorded)."""
        return declines_at(self.frames, step, slot)

    def reasons(self, step: int, slot: str) -> pd.DataFrame:
        """Declines by reason at `step`; the static verdicts' reasons when not recorded."""
        d = self.declines(step, slot)
        if d is None:
            return by_reason(static_verdicts(self.frames), "capture_reason")
        return by_reason(d)

    def table(self, step: int, slot: str, reason: str | None = None, query: str = "", page: int = 0,
              size: int = 20) -> Page:
        """Filterable declines table (static verdicts when segmentation was not recorded)."""
        d = self.declines(step, slot)
        if d is None:
            d = static_verdicts(self.frames).rename(columns={"name": "node", "capture_reason": "reason",
                                                             "capture_detail": "detail"})
        else:
            d = d.drop(columns=["step", "slot"])
        if reason:
            d = d[d["reason"] == reason]
        return page_of(d, page, size, query)

    def seam(self, step: int, slot: str, plan_index: int) -> dict[str, Any] | None:
        """Why node `plan_index` is not captured at `step`: node, op, reason code, detail,
        symbols and segment -- None when it is captured (or nothing says otherwise)."""
        d = self.declines(step, slot)
        if d is not None:
            hit = d[d["plan_index"] == plan_index]
            if hit.empty:
                return None
            r = hit.iloc[0]
            return {"plan_index": int(r["plan_index"]), "node": r["node"], "op_type": r["op_type"],
                    "reason": r["reason"], "detail": r["detail"], "symbols": list(r["symbols"] or []),
                    "segment": None if pd.isna(r["segment"]) else int(r["segment"]), "source": "recorded"}
        sv = static_verdicts(self.frames)
        hit = sv[sv["plan_index"] == plan_index]
        if hit.empty:
            return None
        r = hit.iloc[0]
        return {"plan_index": int(r["plan_index"]), "node": r["name"], "op_type": r["op_type"],
                "reason": r["capture_reason"], "detail": r["capture_detail"], "symbols": [], "segment": None,
                "source": "static verdict"}

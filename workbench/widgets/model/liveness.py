"""LivenessView's model: lifetimes, live-bytes curve and memory numbers at a step."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...reports import Frames, lifetimes_at, live_bytes_curve, memory_at
from ...reports.liveness import values_of_node

__all__ = ["LivenessModel"]


class LivenessModel:
    def __init__(self, frames: Frames):
        self.frames = frames

    def lifetimes(self, step: int, constants: bool = False) -> pd.DataFrame:
        return lifetimes_at(self.frames, step, constants)

    def curve(self, step: int) -> pd.DataFrame:
        return live_bytes_curve(self.frames, step)

    def memory(self, step: int) -> dict[str, Any]:
        return memory_at(self.frames, step)

    def highlight(self, plan_index: int) -> list[str]:
        """The values a selected node produces (outlined in the Gantt)."""
        return values_of_node(self.frames, plan_index) if plan_index >= 0 else []

    def live_at(self, step: int, plan_index: int) -> dict[str, Any]:
        """At node `plan_index`: live activation bytes and the values alive there."""
        c = self.curve(step)
        lt = self.lifetimes(step)
        alive = lt[(lt["start"] <= plan_index) & (lt["end"] >= plan_index)]
        row = c[c["plan_index"] == plan_index]
        return {"live_bytes": int(row["live_bytes"].iloc[0]) if not row.empty else 0,
                "values": alive["value"].tolist()}

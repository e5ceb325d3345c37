"""MemoTimeline's model: mechanism lanes across steps and what each did at one step."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...reports import Frames, latency_frame, mechanism_lanes, step_info

__all__ = ["MemoModel"]


class MemoModel:
    def __init__(self, frames: Frames):
        self.frames = frames

    def lanes(self) -> pd.DataFrame:
        return mechanism_lanes(self.frames)

    def latency(self) -> pd.DataFrame:
        return latency_frame(self.frames)

    def missing(self) -> list[str]:
        """Mechanisms this recording did not record (the view says so instead of drawing)."""
        out = []
        if not self.frames.has("memo_timeline"):
            out.append("decode-plan memo")
        if not self.frames.has("capture_events"):
            out.append("capture events")
        return out

    def totals(self) -> dict[str, int]:
        """Stage 2's counts summed over every step (what the Summary prints)."""
        memo = self.frames.optional("memo_timeline")
        if memo is None:
            return {}
        return {name.replace("_", " "): int(memo[name].fillna(0).sum())
                for name in ("views_reused", "dispatch_elided") if name in memo}

    def at(self, step: int) -> dict[str, Any]:
        """What every lane did at `step` ({lane: "state (xN): detail"}), plus the step header."""
        info = step_info(self.frames, step)
        lanes = self.lanes()
        here = lanes[lanes["step"] == step]
        did: dict[str, str] = {}
        for lane, g in here.groupby("lane", sort=False):
            parts = []
            for state, gg in g.groupby("state", sort=False):
                n = len(gg)
                parts.append(f"{state}{f' ×{n}' if n > 1 else ''}: {gg['detail'].iloc[0]}")
            did[lane] = "; ".join(parts)
        return {"info": info, "lanes": did}

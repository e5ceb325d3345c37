"""The mechanisms across decode steps as lanes: memo action, Stage-2 state, capture events."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["LANE_COLUMNS", "mechanism_lanes"]

#: columns of `mechanism_lanes`
LANE_COLUMNS = ["step", "lane", "state", "detail"]


def _join(items) -> str:
    if items is None:
        return ""
    if isinstance(items, (list, tuple)):
        return ", ".join(map(str, items))
    return str(items)


def mechanism_lanes(src: Recording | Frames) -> pd.DataFrame:
    """One row per (step, lane): what each mechanism did at that step (`LANE_COLUMNS`).

    Lanes: "memo" (primed / rebuilt / replayed / ineligible / disabled, detail = the
    reason and the varying symbols), "stage 2" (none / candidate / validated /
    latched, detail = views reused, dispatch elided), and one "capture · <slot>" lane
    per slot with capture / replay / retire / quarantine events (detail = reason).
    A lane whose table was not recorded has no rows; see `Frames.optional`.
    """
    f = as_frames(src)
    parts = []
    memo = f.optional("memo_timeline")
    if memo is not None and not memo.empty:
        parts.append(pd.DataFrame({
            "step": memo["step"], "lane": "memo", "state": memo["action"],
            "detail": [f"{r or ''}" + (f" · varying: {_join(v)}" if _join(v) else "")
                       for r, v in zip(memo["reason"], memo["varying"])],
        }))
        parts.append(pd.DataFrame({
            "step": memo["step"], "lane": "stage 2", "state": memo["stage2"],
            "detail": [f"views reused {int(a)}, dispatch elided {int(b)} (Stage 2 only: If skipping and shape "
                       f"folding elide nodes too, see the plan), mismatch streak {int(c)}"
                       for a, b, c in zip(memo["views_reused"].fillna(0), memo["dispatch_elided"].fillna(0),
                                          memo["mismatch_streak"].fillna(0))],
        }))
    ev = f.optional("capture_events")
    if ev is not None and not ev.empty:
        slot = ev["slot"] if "slot" in ev else pd.Series(["primary"] * len(ev))
        seg = ev["segment"] if "segment" in ev else pd.Series([None] * len(ev))
        reason = ev["reason"] if "reason" in ev else pd.Series([None] * len(ev))
        parts.append(pd.DataFrame({
            "step": ev["step"].to_numpy(), "lane": [f"capture · {s}" for s in slot],
            "state": ev["event"].to_numpy(),
            "detail": [f"segment {g}: {r or ''}" for g, r in zip(seg, reason)],
        }))
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in LANE_COLUMNS})
    return pd.concat(parts, ignore_index=True)[LANE_COLUMNS]

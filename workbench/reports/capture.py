"""Capture segmentation: segments and declines at a step, by reason; static verdicts.

Segment plans and declines are looked up "as of" a step: the rows of the latest
step at or before it for the slot (a segment plan recorded once stays in force
until a new one is recorded). Everything returns None when the recording has no
capture segmentation (`Frames.optional`), so callers can say it was not recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..tables import CAPTURE_DECLINES_COLUMNS, CAPTURE_SEGMENTS_COLUMNS
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["as_of", "by_reason", "capture_events", "declines_at", "segment_of_nodes", "segments_at",
           "static_verdicts"]

#: a segment plan's / a decline's frame: the step, then the row as written (`workbench.tables`)
SEGMENT_COLUMNS = ["step", *CAPTURE_SEGMENTS_COLUMNS]
DECLINE_COLUMNS = ["step", *CAPTURE_DECLINES_COLUMNS]


def as_of(frame: pd.DataFrame, step: int, slot: str | None) -> pd.DataFrame:
    """The rows of the latest recorded step <= `step` (for `slot` when the frame has slots)."""
    if slot is not None and "slot" in frame:
        frame = frame[frame["slot"] == slot]
    earlier = frame[frame["step"] <= step]
    if earlier.empty:
        return earlier
    return earlier[earlier["step"] == earlier["step"].max()].reset_index(drop=True)


def _plan_index(f: Frames, x) -> int:
    """A segment bound as a plan index (recordings may give the node's name)."""
    if isinstance(x, str):
        nodes = f.get("nodes")
        hit = nodes.loc[nodes["name"] == x, "plan_index"]
        return int(hit.iloc[0]) if not hit.empty else -1
    return -1 if x is None or pd.isna(x) else int(x)


def segments_at(src: Recording | Frames, step: int, slot: str | None = None) -> pd.DataFrame | None:
    """The segment plan in force at `step` for `slot` (None when not recorded)."""
    f = as_frames(src)
    seg = f.optional("segments")
    if seg is None:
        return None
    rows = as_of(seg, step, slot).copy()
    for c in SEGMENT_COLUMNS:
        if c not in rows:
            rows[c] = None
    rows["first_node"] = [_plan_index(f, x) for x in rows["first_node"]]
    rows["last_node"] = [_plan_index(f, x) for x in rows["last_node"]]
    return rows.sort_values("first_node").reset_index(drop=True)


def segment_of_nodes(src: Recording | Frames, step: int, slot: str | None) -> pd.DataFrame | None:
    """plan_index -> segment, segment_kind, segment_state at `step` (None when not recorded)."""
    seg = segments_at(src, step, slot)
    if seg is None:
        return None
    idx, segment, kind, state = [], [], [], []
    for r in seg.itertuples(index=False):
        if r.first_node < 0 or r.last_node < r.first_node:
            continue
        for p in range(r.first_node, r.last_node + 1):
            idx.append(p)
            segment.append(r.segment)
            kind.append(r.kind)
            state.append(r.state)
    out = pd.DataFrame({"segment": pd.array(segment, dtype="Int64"), "segment_kind": kind,
                        "segment_state": state}, index=pd.Index(idx, name="plan_index"))
    return out[~out.index.duplicated(keep="last")]


def declines_at(src: Recording | Frames, step: int, slot: str | None = None) -> pd.DataFrame | None:
    """The capture declines in force at `step` for `slot` (None when not recorded)."""
    d = as_frames(src).optional("capture_declines")
    if d is None:
        return None
    rows = as_of(d, step, slot).copy()
    for c in DECLINE_COLUMNS:
        if c not in rows:
            rows[c] = None
    return rows[DECLINE_COLUMNS].reset_index(drop=True)


def by_reason(declines: pd.DataFrame, reason_col: str = "reason") -> pd.DataFrame:
    """reason, declines (rows), op_types (sorted, comma separated); most frequent first."""
    if declines is None or declines.empty:
        return pd.DataFrame({"reason": pd.Series([], dtype=object), "declines": pd.Series([], dtype="int64"),
                             "op_types": pd.Series([], dtype=object)})
    op_col = "op_type" if "op_type" in declines else None
    g = declines.assign(_r=declines[reason_col].fillna("unknown")).groupby("_r", sort=False)
    out = pd.DataFrame({
        "reason": list(g.groups),
        "declines": [len(x) for _, x in g],
        "op_types": [", ".join(sorted(set(map(str, x[op_col])))) if op_col else "" for _, x in g],
    })
    return out.sort_values(["declines", "reason"], ascending=[False, True]).reset_index(drop=True)


def static_verdicts(src: Recording | Frames) -> pd.DataFrame:
    """Nodes the plan says cannot be captured, or that run on the host fallback.

    Columns: plan_index, name, op_type, domain, kernel, capture_reason, capture_detail.
    These are the static verdicts every recording has, not a recorded segmentation.
    """
    nodes = as_frames(src).get("nodes")
    bad = nodes[(~nodes["capture_supported"].fillna(True).astype(bool)) | (nodes["kernel"] == "host_fallback")]
    out = bad[["plan_index", "name", "op_type", "domain", "kernel", "capture_reason", "capture_detail"]].copy()
    out["capture_reason"] = out["capture_reason"].fillna("host_fallback")
    return out.reset_index(drop=True)


def capture_events(src: Recording | Frames, slot: str | None = None) -> pd.DataFrame | None:
    """capture / replay / retire / quarantine events (None when not recorded)."""
    ev = as_frames(src).optional("capture_events")
    if ev is None:
        return None
    if slot is not None and "slot" in ev:
        ev = ev[ev["slot"] == slot]
    return ev.reset_index(drop=True)

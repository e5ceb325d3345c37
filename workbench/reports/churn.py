"""Capture churn: which captured segments were recorded again and again, and why.

    reports.capture_churn(rec)   # per slot and segment: captures, replays, retires by reason, capture time
    reports.churn_lines(rec)     # the segments whose retires re-recorded the slot, as sentences, worst first

A graph that is retired and recorded again costs a recording (and, on the CPU, the
eager step before it) for nothing: the mechanism has stopped paying. Read from the
capture events and segment rows only, so a saved recording answers the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["CHURN_COLUMNS", "capture_churn", "churn_lines", "retire_markers"]

CHURN_COLUMNS = ["slot", "segment", "first_node", "last_node", "captures", "replays", "retires",
                 "re_records", "capture_ms", "steps_served", "top_retire_reason", "retire_reasons",
                 "limited", "first_step", "last_step"]


def _segment_spans(f: Frames) -> pd.DataFrame:
    """(slot, step, segment) -> first_node, last_node of every captured segment as
    recorded at that step."""
    seg = f.optional("segments")
    if seg is None or seg.empty:
        return pd.DataFrame(columns=["slot", "step", "segment", "first_node", "last_node"])
    seg = seg[seg["kind"] == "captured"]
    return seg[["slot", "step", "segment", "first_node", "last_node"]].drop_duplicates()


def _with_spans(ev: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Each event with the node span of its segment: the latest captured segmentation of
    its slot at or before its step (a retire row's step re-plans the segments)."""
    if ev.empty or spans.empty:
        return ev.assign(first_node=pd.NA, last_node=pd.NA)
    out = []
    for (slot, segment), g in ev.groupby(["slot", "segment"], sort=False):
        s = spans[(spans["slot"] == slot) & (spans["segment"] == segment)].sort_values("step")
        if s.empty:
            out.append(g.assign(first_node=pd.NA, last_node=pd.NA))
            continue
        m = pd.merge_asof(g.sort_values("step"), s[["step", "first_node", "last_node"]], on="step",
                          direction="backward")
        missing = m["first_node"].isna()
        if missing.any():  # an event before the span's first row: the earliest span
            m.loc[missing, ["first_node", "last_node"]] = s[["first_node", "last_node"]].iloc[0].to_numpy()
        out.append(m)
    return pd.concat(out, ignore_index=True)


def capture_churn(src: Recording | Frames) -> pd.DataFrame:
    """One row per (slot, captured segment as a node span): how often it was recorded
    (`captures`; `re_records` = captures after the first), replayed (`replays`, also
    `steps_served`), retired (`retires`, with `retire_reasons` "reason: count; ..." and
    the most frequent one), the milliseconds spent recording it, whether it reached the
    re-record limit (`limited`: its nodes carry the decline `rerecord_limit`), and the
    first / last step with an event. Worst first (most re-records, then retires).
    Columns: `CHURN_COLUMNS`. Empty (with the columns) when nothing was captured."""
    f = as_frames(src)
    ev = f.optional("capture_events")
    if ev is None or ev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in CHURN_COLUMNS})
    ev = ev[(ev["segment"] >= 0) & ev["event"].isin(["capture", "replay", "retire"])]
    ev = _with_spans(ev.copy(), _segment_spans(f))
    if ev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in CHURN_COLUMNS})
    dec = f.optional("capture_declines")
    limited_nodes = set()
    if dec is not None and not dec.empty:
        lim = dec[dec["reason"] == "rerecord_limit"]
        limited_nodes = set(zip(lim["slot"], lim["plan_index"].astype(int)))
    rows = []
    keys = ["slot", "first_node", "last_node"]
    for (slot, first, last), g in ev.groupby(keys, sort=False, dropna=False):
        kinds = g["event"].value_counts()
        retires = g[g["event"] == "retire"]["reason"]
        # the same reason on the same value, whatever its new shape: reason + value + what
        short = retires.map(lambda r: " ".join(str(r).split()[:3]))
        counts = short.value_counts()
        captures = int(kinds.get("capture", 0))
        limited = pd.notna(first) and (slot, int(first)) in limited_nodes
        rows.append((slot, int(g["segment"].iloc[-1]), first, last, captures, int(kinds.get("replay", 0)),
                     int(kinds.get("retire", 0)), max(captures - 1, 0),
                     float(g.loc[g["event"] == "capture", "duration_s"].sum()) * 1e3, int(kinds.get("replay", 0)),
                     counts.index[0] if len(counts) else "",
                     "; ".join(f"{r}: {n}" for r, n in counts.items()), bool(limited),
                     int(g["step"].min()), int(g["step"].max())))
    out = pd.DataFrame(rows, columns=CHURN_COLUMNS)
    # the segments whose checks failed first (they cost every segment of the slot a re-record)
    return out.sort_values(["retires", "re_records", "slot"], ascending=[False, False, True],
                           kind="stable").reset_index(drop=True)


def churn_lines(src: Recording | Frames, limit: int = 5) -> list[str]:
    """The segments whose retires made the slot record its graphs again, as sentences,
    worst first (a retire re-records every segment of the slot; the line names the one
    whose check failed, and why); empty when no graph was retired."""
    churn = capture_churn(src)
    churn = churn[churn["retires"] > 0]
    lines = []
    for r in churn.head(limit).itertuples(index=False):
        span = f"nodes {int(r.first_node)}-{int(r.last_node)}" if pd.notna(r.first_node) else "nodes ?"
        tail = "; now kept eager (rerecord_limit)" if r.limited else ""
        lines.append(f"{r.slot} segment {r.segment} ({span}) retired {r.retires} times ({r.retire_reasons}), "
                     f"re-recorded {r.re_records} times, {r.capture_ms:.1f} ms recording{tail}")
    return lines


def retire_markers(src: Recording | Frames, slot: str | None = None) -> pd.DataFrame:
    """Every retire as a marker for the segmentation figure: step, slot, first_node (the
    retired segment's first node; 0 when the slot's graphs went for a reason of the
    whole step), and `label`, the reason as the figure prints it beside the marker."""
    f = as_frames(src)
    ev = f.optional("capture_events")
    cols = ["step", "slot", "first_node", "label"]
    if ev is None or ev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    ev = ev[ev["event"] == "retire"]
    if slot is not None:
        ev = ev[ev["slot"] == slot]
    if ev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    ev = _with_spans(ev.copy(), _segment_spans(f))
    first = pd.to_numeric(ev["first_node"], errors="coerce").fillna(0).astype(int)
    return pd.DataFrame({"step": ev["step"].astype(int).to_numpy(), "slot": ev["slot"].to_numpy(),
                         "first_node": first.to_numpy(),
                         "label": ["retired: " + str(r) for r in ev["reason"]]})

"""Where a step's wall time went: `step_breakdown(rec)` and its spread over steps.

    reports.step_breakdown(rec)      # per step: µs by part (kernels and seams by op type, ...)
    reports.step_parts(rec)          # the same, one row per step, one column per part
    reports.breakdown_spread(rec)    # p10 / median / p90 µs per part, per phase

A step's wall time (`steps().wall_ms`, begin to end of the run) is split into parts
that sum to it exactly, because the last part is the remainder:

- kernels:  eager node time outside the seams (host fallbacks included), by op type
- seams:    eager node time of the nodes a capture decline in force keeps out of the
            device graphs (`capture_declines`), by op type
- replay:   time replaying recorded device graphs (replayed node spans)
- capture:  time recording graphs beyond the kernels run while recording (the capture
            event's duration minus the segment's node time that step)
- shapes:   binding symbols and resolving shapes (the memo's `resolve_ms`)
- executor: wall time minus everything measured: dispatch, buffer handling, liveness
            and trace rows, shadow checks -- the executor's own host time

Trace overhead is not measured apart: a traced run's clock reads and rows are inside
`executor` (and a little inside each node's time). On a device backend the replay
time is device time and may overlap host work, so `executor` can come out negative;
the parts still sum to the wall time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .capture import as_of
from .coverage import _phases_in
from .source import NOT_RECORDED, Frames, as_frames
from .units import fmt_ms

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["BREAKDOWN_COLUMNS", "SPREAD_COLUMNS", "STEP_PARTS", "breakdown_lines", "breakdown_missing",
           "breakdown_spread", "step_breakdown", "step_parts"]

#: part -> what its time is (the order the frames list them in)
STEP_PARTS: dict[str, str] = {
    "kernels": "eager kernels outside the seams (host fallbacks included), by op type",
    "seams": "eager kernels of the capture seams (nodes a decline keeps out of the device graphs)",
    "replay": "replaying recorded device graphs",
    "capture": "recording device graphs, beyond the kernels run while recording",
    "shapes": "binding symbols and resolving shapes (decode-plan memo)",
    "executor": "the rest of the wall time: dispatch, buffers, liveness and trace rows, shadow checks",
}

BREAKDOWN_COLUMNS = ["step", "slot", "phase", "part", "op_type", "us", "share"]
SPREAD_COLUMNS = ["phase", "part", "op_type", "steps", "p10_us", "median_us", "p90_us", "mean_us", "share"]


def breakdown_missing(src: Recording | Frames) -> list[str]:
    """What the breakdown cannot split out of this recording (its time sits in `executor`)."""
    f = as_frames(src)
    out = []
    if not f.has("memo_timeline"):
        out.append(f"shape resolution (memo resolve time): {NOT_RECORDED}")
    if not f.has("capture_events") or not f.has("segments"):
        out.append(f"capture recording time: {NOT_RECORDED}")
    if not f.has("capture_declines"):
        out.append(f"capture declines (which eager nodes are seams): {NOT_RECORDED}; seams count as kernels")
    if f.get("node_timings").empty:
        out.append(f"node timings: {NOT_RECORDED}")
    return out


def step_breakdown(src: Recording | Frames) -> pd.DataFrame:
    """One row per (step, part, op type): `BREAKDOWN_COLUMNS`; `us` of one step sum to its
    wall time, `share` is us / wall. Steps still open (no wall time) are left out."""
    f = as_frames(src)
    return f.memo("step_breakdown", lambda: _breakdown(f))


def _breakdown(f: Frames) -> pd.DataFrame:
    steps = f.get("steps")
    steps = steps[steps["wall_ms"].notna()]
    t = f.get("node_timings")
    by_step = {int(s): g for s, g in t.groupby("step")}
    seams_of = _seam_sets(f)
    recording = _capture_overhead(f, by_step)
    memo = f.optional("memo_timeline")
    resolve = ({} if memo is None or memo.empty else
               memo.groupby("step")["resolve_ms"].sum().mul(1e3).to_dict())
    rows: list[tuple] = []
    for r in steps.itertuples(index=False):
        s, wall = int(r.step), float(r.wall_ms) * 1e3
        parts: list[tuple[str, str, float]] = []
        g = by_step.get(s)
        if g is not None and not g.empty:
            replayed = g["mode"] == "replayed"
            parts.append(("replay", "", float(g.loc[replayed, "duration_us"].sum())))
            eager = g[~replayed]
            seam = eager["plan_index"].isin(seams_of(s, r.slot))
            for part, rows_ in (("kernels", eager[~seam]), ("seams", eager[seam])):
                for op, us in rows_.groupby("op", sort=False)["duration_us"].sum().items():
                    parts.append((part, str(op), float(us)))
        parts.append(("capture", "", recording.get(s, 0.0)))
        parts.append(("shapes", "", float(resolve.get(s, 0.0) or 0.0)))
        measured = sum(us for _, _, us in parts)
        parts.append(("executor", "", wall - measured))  # the remainder: the parts sum to wall
        for part, op, us in parts:
            rows.append((s, r.slot, r.phase, part, op, us, us / wall if wall > 0 else np.nan))
    out = pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
    order = {p: i for i, p in enumerate(STEP_PARTS)}
    out["_o"] = out["part"].map(order)
    out = out.sort_values(["step", "_o", "us"], ascending=[True, True, False], kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)


def _seam_sets(f: Frames):
    """(step, slot) -> plan indices of the seams in force (declines naming a node)."""
    dec = f.optional("capture_declines")
    cache: dict = {}

    def seams(step: int, slot: str) -> set[int]:
        if dec is None or dec.empty:
            return set()
        d = as_of(dec, step, slot)
        key = (slot, int(d["step"].iloc[0])) if not d.empty else (slot, None)
        if key not in cache:
            cache[key] = {int(p) for p in d["plan_index"].dropna() if int(p) >= 0}
        return cache[key]

    return seams


def _capture_overhead(f: Frames, by_step: dict[int, pd.DataFrame]) -> dict[int, float]:
    """step -> µs spent recording graphs beyond the node time measured inside them."""
    out: dict[int, float] = {}
    for (step, _segment), us in capture_overheads(f, by_step).items():
        out[step] = out.get(step, 0.0) + us
    return out


def capture_overheads(f: Frames, by_step: dict[int, pd.DataFrame]) -> dict[tuple[int, int], float]:
    """(step, segment) -> µs recording that segment beyond its kernels: a capture
    event's duration covers the segment's kernels (already counted as kernels) plus
    the backend's begin / end and, on the CPU, the launch of what was recorded."""
    ev, seg = f.optional("capture_events"), f.optional("segments")
    if ev is None or seg is None or ev.empty:
        return {}
    out: dict[tuple[int, int], float] = {}
    for e in ev[ev["event"] == "capture"].itertuples(index=False):
        s = int(e.step)
        span = seg[(seg["step"] == s) & (seg["slot"] == e.slot) & (seg["segment"] == e.segment)]
        inside = 0.0
        g = by_step.get(s)
        if not span.empty and g is not None:
            lo, hi = int(span["first_node"].iloc[0]), int(span["last_node"].iloc[0])
            inside = float(g.loc[(g["plan_index"] >= lo) & (g["plan_index"] <= hi), "duration_us"].sum())
        key = (s, int(e.segment))
        out[key] = out.get(key, 0.0) + max(float(e.duration_s or 0.0) * 1e6 - inside, 0.0)
    return out


def step_parts(src: Recording | Frames) -> pd.DataFrame:
    """One row per step: step, slot, phase, wall_us, then `<part>_us` for each of
    `STEP_PARTS` (summed over op types); the `<part>_us` of a row sum to wall_us."""
    f = as_frames(src)
    b = step_breakdown(f)
    steps = f.get("steps")
    steps = steps[steps["wall_ms"].notna()][["step", "slot", "phase", "wall_ms"]].reset_index(drop=True)
    out = steps.assign(wall_us=steps["wall_ms"] * 1e3).drop(columns="wall_ms")
    wide = b.groupby(["step", "part"])["us"].sum().unstack(fill_value=0.0)
    for p in STEP_PARTS:
        col = wide[p] if p in wide else pd.Series(dtype=float)
        out[f"{p}_us"] = col.reindex(out["step"]).fillna(0.0).to_numpy()
    return out


def _phase_labels(phases: pd.Series) -> pd.Series:
    """A plain `session.run` loop records phase "": its steps read as "run"."""
    return phases.fillna("").replace("", "run")


def breakdown_spread(src: Recording | Frames, by: str = "part") -> pd.DataFrame:
    """Per phase (prefill / decode / verify; "run" for a plain run loop) and part:
    `SPREAD_COLUMNS` -- steps, p10 / median / p90 / mean µs per step and share (the part's
    µs / the phase's wall µs). `by="op_type"`: one row per (part, op type) of kernels and
    seams too (a step without that op counts 0). A row `part="wall"` gives the step."""
    if by not in ("part", "op_type"):
        raise ValueError(f"breakdown_spread(by={by!r}): use 'part' or 'op_type'")
    f = as_frames(src)
    b = step_breakdown(f)
    if b.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in SPREAD_COLUMNS})
    keys = ["part"] + (["op_type"] if by == "op_type" else [])
    per = b.groupby(["step", *keys])["us"].sum().unstack(keys, fill_value=0.0)
    parts = step_parts(f).set_index("step")
    phase = _phase_labels(parts["phase"])
    rows = []
    for ph, idx in phase.groupby(phase, sort=False).groups.items():
        wall = parts.loc[idx, "wall_us"]
        rows.append(_spread_row(ph, "wall", "", wall, float(wall.sum())))
        for col in per.columns:
            key = col if isinstance(col, tuple) else (col,)
            v = per.loc[per.index.intersection(idx), col].reindex(idx, fill_value=0.0)
            rows.append(_spread_row(ph, key[0], key[1] if len(key) > 1 else "", v, float(wall.sum())))
    out = pd.DataFrame(rows, columns=SPREAD_COLUMNS)
    order = {p: i for i, p in enumerate(["wall", *STEP_PARTS])}
    out["_o"] = out["part"].map(order)
    out = out.sort_values(["_o", "median_us"], ascending=[True, False], kind="stable")
    first = {p: i for i, p in enumerate(dict.fromkeys(out["phase"]))}
    out = out.sort_values("phase", key=lambda s: s.map(first), kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)


def _spread_row(phase: str, part: str, op: str, v: pd.Series, wall_total: float) -> tuple:
    a = v.to_numpy(dtype=float)
    q = np.percentile(a, [10, 50, 90]) if len(a) else [np.nan] * 3
    return (phase, part, op, len(a), float(q[0]), float(q[1]), float(q[2]), float(a.mean()) if len(a) else np.nan,
            float(a.sum()) / wall_total if wall_total else np.nan)


def breakdown_lines(src: Recording | Frames, top_ops: int = 3) -> list[str]:
    """One sentence per phase: the median step and what its time went to, e.g.
    'decode step median 0.412 ms (p10 0.39, p90 0.52): kernels 38% (MatMul 21%, ...), ...'."""
    f = as_frames(src)
    spread = breakdown_spread(f)
    if spread.empty:
        return []
    ops = breakdown_spread(f, by="op_type")
    decode = _phases_in(f.get("steps")["phase"], ("decode",))
    lines = []
    for ph, g in spread.groupby("phase", sort=False):
        w = g[g["part"] == "wall"].iloc[0]
        bits = []
        for r in g[g["part"] != "wall"].itertuples(index=False):
            if r.share != r.share or abs(r.share) < 0.005:  # NaN or under half a percent
                continue
            bit = f"{r.part} {100 * r.share:.0f}%"
            if r.part in ("kernels", "seams"):
                o = ops[(ops["phase"] == ph) & (ops["part"] == r.part)].sort_values("share", ascending=False)
                named = [f"{x.op_type} {100 * x.share:.0f}%" for x in o.head(top_ops).itertuples(index=False)
                         if x.share >= 0.005]
                bit += f" ({', '.join(named)})" if named else ""
            bits.append(bit)
        label = "decode" if ph == "run" and decode == ("",) else ph
        lines.append(f"{label} step median {fmt_ms(w.median_us / 1e3)} (p10 {w.p10_us / 1e3:.3f}, "
                     f"p90 {w.p90_us / 1e3:.3f}; {int(w.steps)} steps): " + ", ".join(bits))
    return lines

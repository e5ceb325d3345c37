"""Capture coverage (how much of each step ran inside device graphs) and what the seams cost.

    reports.capture_coverage(rec)   # per step and slot: nodes and time replayed / eager / host fallback
    reports.seam_costs(rec)         # per seam (or per decline reason): µs per token, share of step time

Both read the node timings (`Recording.node_timings`), the static plan (kernel kind)
and, for seams, the capture declines in force at each step -- nothing else, so a
saved recording answers the same as a live one. A replayed segment's time is
measured once and shared evenly by its nodes (`Recording.node_span`), so per-node
replayed time is an even split; totals per step are exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .capture import as_of
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["COVERAGE_KINDS", "capture_coverage", "decode_coverage", "seam_costs", "tokens_per_step"]

#: what a node execution counts as: replayed (inside a device graph), eager (dispatched,
#: native kernel), host_fallback (the onnx.reference kernel, whatever its mode), elided (Stage 2)
COVERAGE_KINDS = ("replayed", "eager", "host_fallback", "elided")


def _kinds(f: Frames) -> pd.DataFrame:
    """node_timings + `kind` (one of COVERAGE_KINDS) per execution."""
    t = f.get("node_timings")
    nodes = f.get("nodes")
    fallback = set(nodes.loc[nodes["kernel"] == "host_fallback", "plan_index"].tolist())
    kind = np.where(t["plan_index"].isin(fallback), "host_fallback", t["mode"].to_numpy(dtype=object))
    return t.assign(kind=kind)


def capture_coverage(src: Recording | Frames) -> pd.DataFrame:
    """Per step (and its slot, phase): how the plan's nodes ran, as counts, time and shares.

    Columns: step, slot, phase, nodes (executions), time_us (their summed time), then
    for each kind in `COVERAGE_KINDS` (replayed, eager, host_fallback, elided):
    `<kind>_nodes`, `<kind>_us`, `<kind>_share` (of the step's node executions) and
    `<kind>_time_share` (of its node time). A node whose kernel is the host fallback
    counts as host_fallback (not eager). An If whose branch ran as a graph of its own
    counts as that branch's nodes, replayed as its `branch_capture` row says and eager
    for the rest; its time is the branch's node time (replayed segments and eager
    kernels, the row's replayed_us and eager_us) where the row has eager_us, as a graph's
    own node time leaves out its executor's bookkeeping; else the If's own time, its
    replayed part moved to replayed. Shares of one step sum to 1 (NaN for a step with no
    node executions recorded).
    """
    f = as_frames(src)
    t = _kinds(f)
    steps = f.get("steps")[["step", "slot", "phase"]].reset_index(drop=True)
    out = steps.copy()
    counts = t.groupby(["step", "kind"]).size().unstack(fill_value=0)
    times = t.groupby(["step", "kind"])["duration_us"].sum().unstack(fill_value=0.0)
    n = counts.sum(axis=1).reindex(out["step"]).fillna(0).astype("int64").to_numpy()
    total = times.sum(axis=1).reindex(out["step"]).fillna(0.0).to_numpy()
    branch_nodes, branch_replayed, branch_us, branch_eager_us = _branch_replays(f, out["step"])
    # an If branch run as a graph of its own (optimum's merged decoder): its nodes count
    # instead of the If; its node time (replayed and eager) instead of the If's time
    # where its eager kernels were timed, else its replayed time moves out of the If's
    if_us = _branch_if_time(f, t, out["step"])
    # the If's time that is not its branch's node time: the branch executor's own
    # bookkeeping, where the row timed the branch's eager kernels (else none is known)
    bookkeeping = np.where(np.isnan(branch_eager_us), 0.0, if_us - branch_us - np.nan_to_num(branch_eager_us))
    total = total - bookkeeping
    n = n + np.maximum(branch_nodes - 1, 0)
    out["nodes"] = n
    out["time_us"] = total
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in COVERAGE_KINDS:
            c = (counts[k] if k in counts else pd.Series(dtype="int64")).reindex(out["step"]).fillna(0)
            us = (times[k] if k in times else pd.Series(dtype=float)).reindex(out["step"]).fillna(0.0)
            if k == "replayed":
                c, us = c + branch_replayed, us + branch_us
            elif k == "eager":
                c = c + np.maximum(branch_nodes - branch_replayed - 1, 0) * (branch_nodes > 0)
                us = (us - branch_us - bookkeeping).clip(lower=0.0)
            out[f"{k}_nodes"] = c.astype("int64").to_numpy()
            out[f"{k}_us"] = us.to_numpy()
            out[f"{k}_share"] = np.where(n > 0, c.to_numpy() / np.maximum(n, 1), np.nan)
            out[f"{k}_time_share"] = np.where(total > 0, us.to_numpy() / np.where(total > 0, total, 1), np.nan)
    return out


def _branch_replays(f: Frames, steps: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per step (in `steps`' order): the nodes of the If branches that ran as graphs of
    their own, how many of them a captured segment replayed, its µs, and the µs of
    their eager kernels (zeros without a branch_capture table; eager µs NaN where a
    step has a row that did not time them, or none)."""
    rows = f.optional("branch_capture")
    if rows is None or rows.empty:
        zeros = np.zeros(len(steps))
        return zeros.astype("int64"), zeros.astype("int64"), zeros, np.full(len(steps), np.nan)
    per = rows.groupby("step")[["nodes", "replayed_nodes", "replayed_us"]].sum().reindex(steps).fillna(0)
    # a step's figure only where every one of its rows timed its kernels
    eager = (rows.groupby("step")["eager_us"].agg(lambda v: v.sum() if v.notna().all() else np.nan)
             if "eager_us" in rows else pd.Series(dtype=float))
    return (per["nodes"].to_numpy(dtype="int64"), per["replayed_nodes"].to_numpy(dtype="int64"),
            per["replayed_us"].to_numpy(dtype=float), eager.reindex(steps).to_numpy(dtype=float))


def _branch_if_time(f: Frames, t: pd.DataFrame, steps: pd.Series) -> np.ndarray:
    """Per step: the µs of the If nodes whose branch has a branch_capture row that step."""
    rows = f.optional("branch_capture")
    if rows is None or rows.empty:
        return np.zeros(len(steps))
    ifs = rows[["step", "plan_index"]].drop_duplicates()
    timed = t.merge(ifs, on=["step", "plan_index"])
    return timed.groupby("step")["duration_us"].sum().reindex(steps).fillna(0.0).to_numpy(dtype=float)


def decode_coverage(src: Recording | Frames, phases: tuple[str, ...] = ("decode",)) -> dict:
    """One time-weighted figure for the decode: the share of node time spent in replayed
    device graphs over every step of `phases` (and node-weighted, for comparison).

    Returns {"steps", "time_share" (replayed µs / all node µs), "node_share", and
    "<kind>_time_share" for each kind}; shares are None when no such step ran.
    """
    cov = capture_coverage(src)
    d = cov[cov["phase"].isin(_phases_in(cov["phase"], phases))]
    total, n = float(d["time_us"].sum()), int(d["nodes"].sum())
    out: dict = {"steps": len(d)}
    for k in COVERAGE_KINDS:
        out[f"{k}_time_share"] = float(d[f"{k}_us"].sum()) / total if total > 0 else None
        out[f"{k}_node_share"] = int(d[f"{k}_nodes"].sum()) / n if n else None
    out["time_share"] = out["replayed_time_share"]
    out["node_share"] = out["replayed_node_share"]
    return out


def _phases_in(recorded: pd.Series, phases: tuple[str, ...]) -> tuple[str, ...]:
    """`phases`, or every step's where none has a phase: a plain `session.run` loop (no
    Generator) records its steps with phase "", and they are all decode steps there."""
    if recorded.isin(phases).any() or not (recorded.fillna("") == "").all():
        return phases
    return ("",)


def tokens_per_step(src: Recording | Frames) -> pd.Series:
    """step -> tokens the step produced (the tokens table; 1 per step when no Generator
    recorded tokens, 0 for a step that produced none)."""
    f = as_frames(src)
    steps = f.get("steps")["step"]
    tok = f.optional("tokens")
    if tok is None or tok.empty:
        return pd.Series(1, index=pd.Index(steps, name="step"), dtype="int64")
    return tok.groupby("step").size().reindex(steps, fill_value=0).astype("int64").rename_axis("step")


SEAM_COLUMNS = ["slot", "reason", "plan_index", "node", "op_type", "segment", "steps", "tokens",
                "total_us", "us_per_token", "share_of_step", "detail", "p10_us", "median_us", "p90_us"]
REASON_COLUMNS = ["slot", "reason", "seams", "op_types", "steps", "tokens", "total_us", "us_per_token",
                  "share_of_step", "p10_us", "median_us", "p90_us"]


def seam_costs(src: Recording | Frames, by: str = "seam",
               phases: tuple[str, ...] = ("decode", "verify")) -> pd.DataFrame:
    """What the eager seams cost: declines ⨝ segments ⨝ node timings, most expensive first.

    Over every step of `phases` that has a capture segmentation in force (the
    declines recorded at or before it, for its slot), each seam node's eager time at
    that step is summed. `by="seam"` (default): one row per (slot, seam node):
    `SEAM_COLUMNS` -- reason (the decline code), plan_index, node, op_type, segment,
    steps (measured), tokens (they produced), total_us, us_per_token, share_of_step
    (seam time / the steps' wall time), detail. A `capture_disabled` decline (capture
    off: plan_index -1) is charged every node's time. `by="reason"`: one row per
    (slot, reason): `REASON_COLUMNS` (seams = distinct seam nodes, op_types).
    Both end with the spread over steps of a row's µs per step: p10_us, median_us,
    p90_us (one slow step moves the total, not the median).
    Sorted by us_per_token, highest first. Empty (with the columns) when no capture
    segmentation was recorded.
    """
    if by not in ("seam", "reason"):
        raise ValueError(f"seam_costs(by={by!r}): use 'seam' or 'reason'")
    f = as_frames(src)
    dec = f.optional("capture_declines")
    cols = SEAM_COLUMNS if by == "seam" else REASON_COLUMNS
    if dec is None or dec.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    steps = f.get("steps")
    steps = steps[steps["phase"].isin(_phases_in(steps["phase"], phases))]
    tokens = tokens_per_step(f)
    t = f.get("node_timings")
    t_by_step = {s: g for s, g in t.groupby("step")}
    rows = []
    for r in steps.itertuples(index=False):
        d = as_of(dec, int(r.step), r.slot)
        if d.empty:
            continue
        times = t_by_step.get(int(r.step))
        if times is None:
            continue
        per_node = times.groupby("plan_index")["duration_us"].sum()
        wall_us = float(r.wall_ms) * 1e3 if pd.notna(r.wall_ms) else float(per_node.sum())
        for x in d.itertuples(index=False):
            p = int(x.plan_index) if pd.notna(x.plan_index) else -1
            us = float(per_node.sum()) if p < 0 else float(per_node.get(p, 0.0))
            rows.append((r.slot, x.reason, p, x.node or "", x.op_type or "", x.segment, int(r.step),
                         int(tokens.get(int(r.step), 1)), us, wall_us, x.detail))
    raw = pd.DataFrame(rows, columns=["slot", "reason", "plan_index", "node", "op_type", "segment", "step",
                                      "tokens", "us", "wall_us", "detail"])
    if raw.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    if by == "seam":
        g = raw.groupby(["slot", "plan_index"], sort=False)
        out = g.agg(reason=("reason", "last"), node=("node", "last"), op_type=("op_type", "last"),
                    segment=("segment", "last"), steps=("step", "nunique"), tokens=("tokens", "sum"),
                    total_us=("us", "sum"), wall_us=("wall_us", "sum"), detail=("detail", "last")).reset_index()
        out = out.merge(_spread(raw, ["slot", "plan_index"]), on=["slot", "plan_index"])
    else:
        # tokens and wall time once per step, however many seams the step had
        per_step = raw.drop_duplicates(["slot", "reason", "step"])
        g = raw.groupby(["slot", "reason"], sort=False)
        out = g.agg(seams=("plan_index", "nunique"),
                    op_types=("op_type", lambda s: ", ".join(sorted({str(v) for v in s if v}))),
                    steps=("step", "nunique"), total_us=("us", "sum")).reset_index()
        ps = per_step.groupby(["slot", "reason"], sort=False).agg(tokens=("tokens", "sum"),
                                                                  wall_us=("wall_us", "sum")).reset_index()
        out = out.merge(ps, on=["slot", "reason"])
        out = out.merge(_spread(raw, ["slot", "reason"]), on=["slot", "reason"])
    out["us_per_token"] = out["total_us"] / out["tokens"].where(out["tokens"] > 0)
    out["share_of_step"] = out["total_us"] / out["wall_us"].where(out["wall_us"] > 0)
    out = out.sort_values(["us_per_token", "total_us"], ascending=False, kind="stable", na_position="last")
    return out[cols].reset_index(drop=True)


def _spread(raw: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """p10 / median / p90 over steps of each group's µs per step (its seams summed per step)."""
    per_step = raw.groupby([*keys, "step"], sort=False)["us"].sum()
    q = per_step.groupby(level=list(range(len(keys))), sort=False).quantile([0.1, 0.5, 0.9]).unstack()
    q.columns = ["p10_us", "median_us", "p90_us"]
    return q.reset_index()

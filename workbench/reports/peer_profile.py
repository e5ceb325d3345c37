"""onnxruntime's own profile of the same model, node by node, next to a recording.

    path = ort_session.end_profiling()          # SessionOptions.enable_profiling = True
    theirs = reports.peer_profile(path)         # per node: onnxruntime's kernel time
    joined = reports.join_peer_profile(rec, theirs)   # ours vs theirs, biggest difference first

onnxruntime's profiler writes Chrome trace events; a kernel is an event with cat
"Node" whose name is the node's name + "_kernel_time" (args: op_name, provider).
Its graph optimizer fuses and renames nodes (SimplifiedLayerNormFusion, ...), so the
join says which of our plan's nodes do not appear in its profile (fused or folded
away there) and which of its nodes are not in our plan (the fused nodes' names).

A recording carries a profile as its generic table `peer_profile` (one row per
node, `peer_profile`'s columns; `workbench report` adds it), so a saved recording
keeps the comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .coverage import _phases_in
from .source import Frames, as_frames
from .units import fmt_us

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["JOIN_COLUMNS", "PROFILE_COLUMNS", "join_peer_profile", "peer_events", "peer_lines", "peer_profile",
           "recorded_peer_profile"]

KERNEL_SUFFIX = "_kernel_time"
PROFILE_COLUMNS = ["node", "op_type", "provider", "calls", "runs", "total_us", "us_per_run", "run_us"]
JOIN_COLUMNS = ["node", "op_type", "found_in", "provider", "ours_us", "peer_us", "diff_us", "ratio", "ours_split"]


def peer_events(path: str | Path, skip_runs: int = 0) -> pd.DataFrame:
    """Every kernel event of an onnxruntime profile: run (0, 1, ... by the session's
    model_run intervals; -1 outside any), node, op_type, provider, ts_us, dur_us.
    Runs before `skip_runs` are dropped (e.g. 1: the prefill run of a Generator loop)."""
    events = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(events, dict):  # the {"traceEvents": [...]} form
        events = events.get("traceEvents", [])
    runs = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = np.array([a for a, _ in runs])
    kept = runs[skip_runs:]
    rows = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        args = e.get("args") or {}
        ts = float(e.get("ts", 0))
        k = int(np.searchsorted(starts, ts, side="right")) - 1 if len(runs) else -1
        run = k if k >= 0 and ts <= runs[k][1] else -1
        rows.append((run, name[: -len(KERNEL_SUFFIX)], str(args.get("op_name", "")),
                     str(args.get("provider", "")), ts, float(e.get("dur", 0))))
    out = pd.DataFrame(rows, columns=["run", "node", "op_type", "provider", "ts_us", "dur_us"])
    if skip_runs:
        out = out[out["run"] >= skip_runs].reset_index(drop=True)
    out.attrs["runs"] = len(kept)  # runs without a kernel event still count
    # a profiled run is slower than an unprofiled one: its length says by how much
    out.attrs["run_us"] = float(np.mean([b - a for a, b in kept])) if kept else float("nan")
    return out


def peer_profile(path: str | Path, skip_runs: int = 0) -> pd.DataFrame:
    """Per node of onnxruntime's profile: `PROFILE_COLUMNS` -- node (its name in
    onnxruntime's optimized graph), op_type, provider, calls, runs (model runs in the
    profile, after `skip_runs`), total_us (kernel time summed), us_per_run, run_us (the
    mean profiled model_run: profiling slows onnxruntime, compare with its unprofiled
    ms/token); costliest first."""
    ev = peer_events(path, skip_runs)
    runs = int(ev.attrs.get("runs", 0)) or max(ev["run"].nunique(), 1)
    if ev.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in PROFILE_COLUMNS})
    g = ev.groupby("node", sort=False).agg(op_type=("op_type", "first"), provider=("provider", "first"),
                                            calls=("dur_us", "size"), total_us=("dur_us", "sum")).reset_index()
    g["runs"] = runs
    g["us_per_run"] = g["total_us"] / runs
    g["run_us"] = ev.attrs.get("run_us", float("nan"))
    return g.sort_values("total_us", ascending=False, kind="stable")[PROFILE_COLUMNS].reset_index(drop=True)


def recorded_peer_profile(src: Recording | Frames) -> pd.DataFrame | None:
    """The profile a recording carries (table `peer_profile`), or None."""
    f = as_frames(src)
    prof = f.optional("peer_profile")
    if prof is None or prof.empty:
        return None
    return prof[[c for c in PROFILE_COLUMNS if c in prof.columns]]


def join_peer_profile(src: Recording | Frames, profile: pd.DataFrame | None = None,
                      phases: tuple[str, ...] = ("decode", "verify")) -> pd.DataFrame:
    """Ours vs onnxruntime's per node (`JOIN_COLUMNS`), by node name, biggest |diff_us| first.

    ours_us: workbench's node time per step over the steps of `phases` (a plain run
    loop: every step); ours_split: part of it is a replayed segment's time shared
    evenly by its nodes (not that node's own measurement);
    peer_us: onnxruntime's kernel time per run; diff_us = ours - theirs; ratio =
    ours / theirs. found_in: "both", "workbench only" (a node of our plan missing from
    onnxruntime's profile: fused or folded away there) or "onnxruntime only" (its node
    is not in our plan: a fused node's name, or one our load-time rewrites removed).
    `profile` defaults to the one the recording carries; empty when there is none.
    """
    f = as_frames(src)
    profile = recorded_peer_profile(f) if profile is None else profile
    if profile is None or profile.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in JOIN_COLUMNS})
    steps = f.get("steps")
    chosen = steps[steps["phase"].isin(_phases_in(steps["phase"], phases))]["step"]
    if chosen.empty:
        chosen = steps["step"]
    t = f.get("node_timings")
    t = t[t["step"].isin(set(chosen))]
    nodes = f.get("nodes")[["name", "op_type"]].rename(columns={"name": "node"})
    ours = t.groupby("node")["duration_us"].sum() / max(len(chosen), 1)
    split = set(t.loc[t["mode"] == "replayed", "node"])
    mine = nodes.assign(ours_us=nodes["node"].map(ours).fillna(0.0), ours_split=nodes["node"].isin(split))
    theirs = profile[["node", "op_type", "provider", "us_per_run"]].rename(
        columns={"op_type": "peer_op_type", "us_per_run": "peer_us"})
    j = mine.merge(theirs, on="node", how="outer", indicator=True)
    j["found_in"] = j["_merge"].map({"both": "both", "left_only": "workbench only",
                                    "right_only": "onnxruntime only"}).astype(str)
    j["op_type"] = j["op_type"].fillna(j["peer_op_type"])
    j["ours_us"] = j["ours_us"].fillna(0.0)
    j["peer_us"] = j["peer_us"].fillna(0.0)
    j["provider"] = j["provider"].fillna("")
    j["ours_split"] = j["ours_split"].fillna(False).astype(bool)
    j["diff_us"] = j["ours_us"] - j["peer_us"]
    j["ratio"] = j["ours_us"] / j["peer_us"].where(j["peer_us"] > 0)
    j = j.reindex(j["diff_us"].abs().sort_values(ascending=False, kind="stable").index)
    return j[JOIN_COLUMNS].reset_index(drop=True)


def peer_lines(src: Recording | Frames, profile: pd.DataFrame | None = None, top: int = 3) -> list[str]:
    """Sentences for the summary: kernel time per run on both sides, the nodes only one
    side has, and the `top` nodes the difference comes from."""
    j = join_peer_profile(src, profile)
    if j.empty:
        return []
    counts = j["found_in"].value_counts()
    ours, theirs = float(j["ours_us"].sum()), float(j["peer_us"].sum())
    lines = [f"node time per decode step: workbench {fmt_us(ours)}, onnxruntime's kernels {fmt_us(theirs)} "
             f"({ours / theirs:.2f}x)" if theirs > 0 else f"node time per decode step: workbench {fmt_us(ours)}",
             f"{int(counts.get('both', 0))} nodes in both; {int(counts.get('workbench only', 0))} of our plan's "
             f"nodes are not in onnxruntime's profile (fused or folded away there); "
             f"{int(counts.get('onnxruntime only', 0))} of its nodes are not in our plan (fused names)"]
    prof = recorded_peer_profile(src) if profile is None else profile
    if prof is not None and "run_us" in prof and pd.notna(prof["run_us"].iloc[0]):
        lines.append(f"onnxruntime's profiled runs took {float(prof['run_us'].iloc[0]) / 1e3:.3f} ms each "
                     "(its profiler slows it: compare nodes with each other, the latency ratio unprofiled)")
    for r in j.head(top).itertuples(index=False):
        ratio = f", {r.ratio:.1f}x" if pd.notna(r.ratio) else ""
        split = " (a replayed segment's time split evenly)" if r.ours_split else ""
        lines.append(f"{r.node} ({r.op_type}, {r.found_in}): ours {fmt_us(r.ours_us)}{split} vs "
                     f"{fmt_us(r.peer_us)}, {r.diff_us:+.1f} µs{ratio}")
    return lines

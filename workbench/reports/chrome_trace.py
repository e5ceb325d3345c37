"""`to_chrome_trace(rec, path)`: a recording as Chrome trace-event JSON (Perfetto, chrome://tracing).

    reports.to_chrome_trace(rec, "decode.trace.json")   # open it in ui.perfetto.dev

One track (thread) per slot holds, nested by time, each step (ph "X"), its capture
segments (captured / replayed / eager) and its nodes; instants (ph "i") mark
capture, replay, retire, quarantine and bake with their reason in args; counters
(ph "C") draw live activation bytes from the liveness rows.

The recording keeps durations, not clock readings, so the timeline is laid out
from them: steps back to back (the time between runs is not recorded), within a
step the shape resolution first, then the nodes in emission order with the
executor's unmeasured host time spread evenly between them, and each recording's
overhead after its segment's nodes. Where the measured parts exceed a step's wall
time (device time overlapping host work) they are scaled to fit, so every node
stays inside its step. Timestamps are microseconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .anatomy import capture_overheads
from .liveness import live_bytes_curve
from .source import Frames, as_frames
from .steps import slots

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["chrome_trace", "to_chrome_trace"]

PID = 1


def to_chrome_trace(src: Recording | Frames, path: str | Path) -> Path:
    """Write `chrome_trace(src)` to `path` as JSON; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(chrome_trace(src), allow_nan=False), encoding="utf-8")
    return out


def chrome_trace(src: Recording | Frames) -> dict:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
    f = as_frames(src)
    tids = {slot: i + 1 for i, slot in enumerate(slots(f))}
    events: list[dict] = [_meta("process_name", 0, name="workbench recording")]
    for slot, tid in tids.items():
        events.append(_meta("thread_name", tid, name=f"slot {slot}"))
        events.append(_meta("thread_sort_index", tid, sort_index=tid))
    steps = f.get("steps")
    t = f.get("node_timings")
    by_step = {int(s): g.sort_values("seq", kind="stable") for s, g in t.groupby("step")}
    overhead = capture_overheads(f, by_step)
    memo = f.optional("memo_timeline")
    resolve = {} if memo is None or memo.empty else memo.groupby("step")["resolve_ms"].sum().mul(1e3).to_dict()
    seg = f.optional("segments")
    # the generic table itself: its `seq` places each event among the node rows
    ev = f.recording.table("capture_events") if f.has("capture_events") else None
    has_liveness = not f.get("liveness").empty
    clock = 0.0
    for r in steps.itertuples(index=False):
        s = int(r.step)
        if r.wall_ms != r.wall_ms:  # an open step has no wall time yet
            continue
        wall = float(r.wall_ms) * 1e3
        tid = tids.get(r.slot, 1)
        step_seg = seg[(seg["step"] == s) & (seg["slot"] == r.slot)] if seg is not None else None
        nodes = by_step.get(s, t.head(0))
        layout = _lay_out(nodes, step_seg, wall, float(resolve.get(s, 0.0) or 0.0),
                          {seg_: us for (st, seg_), us in overhead.items() if st == s}, clock)
        events.append(_x(f"step {s} ({r.phase or 'run'})", "step", clock, wall, tid,
                         step=s, slot=r.slot, phase=r.phase, bindings=dict(r.bindings), wall_us=wall))
        if layout["resolve_us"] > 0:
            events.append(_x("resolve shapes", "executor", clock, layout["resolve_us"], tid, step=s))
        events.extend(_segment_events(layout, step_seg, s, tid))
        for n in layout["nodes"]:
            events.append(_x(n["name"], "node", n["ts"], n["dur"], tid, step=s, plan_index=n["plan_index"],
                             op_type=n["op"], mode=n["mode"], duration_us=n["measured"]))
        if ev is not None and not ev.empty:
            events.extend(_instants(ev[(ev["step"] == s) & (ev["slot"] == r.slot)], layout, step_seg, clock, tid))
        if has_liveness:
            events.extend(_counters(f, s, layout, clock, r.slot))
        clock += wall
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "workbench", "timeline": "laid out from recorded durations: steps back to "
                          "back, unmeasured executor time spread between nodes"}}


def _lay_out(nodes: pd.DataFrame, step_seg: pd.DataFrame | None, wall: float, resolve: float,
             overhead: dict[int, float], start: float) -> dict[str, Any]:
    """Start and duration of every node of one step, and where each recording's overhead
    (`overhead`: segment -> µs) sits: after the last node of its segment."""
    durations = nodes["duration_us"].fillna(0.0).clip(lower=0.0).to_numpy(dtype=float)
    recorded_last: dict[int, float] = {}
    if overhead and step_seg is not None:
        for g in step_seg.itertuples(index=False):
            if int(g.segment) in overhead:
                recorded_last[int(g.last_node)] = overhead[int(g.segment)]
    measured = resolve + float(durations.sum()) + sum(recorded_last.values())
    scale = wall / measured if measured > wall and measured > 0 else 1.0
    gap = (wall - measured * scale) / (len(durations) + 1)  # the unmeasured executor time, spread
    ts = start + resolve * scale + gap
    out = []
    for row, dur in zip(nodes.itertuples(index=False), durations):
        d = dur * scale
        p = int(row.plan_index)
        out.append({"name": str(row.node), "op": str(row.op), "mode": str(row.mode), "plan_index": p,
                    "ts": ts, "dur": d, "measured": float(dur), "seq": int(row.seq)})
        ts += d + recorded_last.get(p, 0.0) * scale + gap
    return {"nodes": out, "resolve_us": resolve * scale, "overhead_after": recorded_last, "scale": scale}


def _segment_events(layout: dict, step_seg: pd.DataFrame | None, step: int, tid: int) -> list[dict]:
    if step_seg is None or step_seg.empty:
        return []
    out = []
    nodes = layout["nodes"]
    for g in step_seg.itertuples(index=False):
        inside = [n for n in nodes if int(g.first_node) <= n["plan_index"] <= int(g.last_node)]
        if not inside:
            continue
        a = min(n["ts"] for n in inside)
        b = max(n["ts"] + n["dur"] for n in inside)
        b += layout["overhead_after"].get(int(g.last_node), 0.0) * layout["scale"]
        label = "eager" if g.kind == "eager" else str(g.state)
        out.append(_x(f"segment {int(g.segment)} ({label})", "segment", a, b - a, tid, step=step,
                      segment=int(g.segment), kind=g.kind, state=g.state, first_node=int(g.first_node),
                      last_node=int(g.last_node), node_count=int(g.node_count)))
    return out


def _instants(ev: pd.DataFrame, layout: dict, step_seg: pd.DataFrame | None, step_start: float,
              tid: int) -> list[dict]:
    """Capture events where they happened: a capture at the end of its segment's
    recording, a replay at its segment's start, any other (retire, quarantine, bake)
    after the last node row emitted before it (`seq`; the step's start without one)."""
    nodes = layout["nodes"]
    spans = {}
    if step_seg is not None:
        for g in step_seg.itertuples(index=False):
            inside = [n for n in nodes if int(g.first_node) <= n["plan_index"] <= int(g.last_node)]
            if inside:
                spans[int(g.segment)] = (inside[0], inside[-1])
    out = []
    for e in ev.itertuples(index=False):
        span = spans.get(int(e.segment)) if e.segment is not None and e.segment == e.segment else None
        at = step_start
        if e.event == "replay" and span:
            at = span[0]["ts"]
        elif e.event == "capture" and span:
            at = _end(span[1], layout)
        else:
            before = [n for n in nodes if n["seq"] < getattr(e, "seq", -1)]
            at = _end(before[-1], layout) if before else step_start
        out.append({"name": str(e.event), "cat": "capture", "ph": "i", "s": "t", "pid": PID, "tid": tid,
                    "ts": at, "args": _args(step=int(e.step), slot=e.slot, segment=e.segment, reason=e.reason,
                                            duration_us=None if e.duration_s is None else 1e6 * e.duration_s)})
    return out


def _end(node: dict, layout: dict) -> float:
    """Where a node's work ends on the timeline, a recording's overhead after it included."""
    return node["ts"] + node["dur"] + layout["overhead_after"].get(node["plan_index"], 0.0) * layout["scale"]


def _counters(f: Frames, step: int, layout: dict, step_start: float, slot: str) -> list[dict]:
    curve = live_bytes_curve(f, step)
    if curve.empty or not curve["live_bytes"].any():
        return []
    live = dict(zip(curve["plan_index"], curve["live_bytes"]))
    alloc = dict(zip(curve["plan_index"], curve["allocated_bytes"]))
    out = []
    for n in layout["nodes"]:
        p = n["plan_index"]
        if p in live:
            out.append({"name": f"live bytes ({slot})", "cat": "memory", "ph": "C", "pid": PID, "ts": n["ts"],
                        "args": {"live": int(live[p]), "one buffer per value": int(alloc[p])}})
    return out


def _x(name: str, cat: str, ts: float, dur: float, tid: int, **args) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid, "ts": float(ts),
            "dur": max(float(dur), 0.0), "args": _args(**args)}


def _meta(kind: str, tid: int, **args) -> dict:
    return {"name": kind, "ph": "M", "pid": PID, "tid": tid, "args": args}


def _args(**args) -> dict:
    """JSON-safe args: numpy scalars as Python numbers, NaN as null, others as text."""
    return {k: _plain(v) for k, v in args.items()}


def _plain(v):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(v) or math.isinf(v) else float(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return None if v is pd.NA else str(v)

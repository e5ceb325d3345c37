"""What is live at the activation peak, and what the resident memory is made of.

    reports.peak_values(rec)          # the values live at the peak, views under their owner, by bytes
    reports.resident_breakdown(rec)   # weights, KV cache, activations, workspace -- "why N x the file?"

The activation peak is the liveness peak: the plan index of a step where the most
activation bytes are live at once (`memory_planner.lower_bound`; an owner lives from
its producer to the last use of the value or of any view / alias in its buffer).
Views and in-place aliases own no bytes: they are listed under their owner, whose
bytes count once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..trace.memory import liveness_intervals
from .kv import kv_value_ids
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["PEAK_COLUMNS", "RESIDENT_CATEGORIES", "peak_step", "peak_values", "resident_breakdown"]

#: columns of `peak_values`
PEAK_COLUMNS = ["step", "peak_index", "value", "bytes", "share", "kind", "node", "op_type", "first_def",
                "last_use", "pinned", "shared_with", "value_id"]

#: rows of `resident_breakdown`, in order
RESIDENT_CATEGORIES = ("weights", "kv_cache", "activations", "inputs", "workspace")


def _step_rows(f: Frames, step: int) -> pd.DataFrame:
    lv = f.get("liveness")
    return lv[lv["step"] == step]


def _root(parent: dict[int, int], v: int) -> int:
    hops = 0
    while v in parent and parent[v] != v and hops <= len(parent):
        v, hops = parent[v], hops + 1
    return v


def _profile(lv: pd.DataFrame) -> tuple[list, int, int]:
    """(intervals, peak plan index, peak bytes) of one step's liveness rows."""
    ivs = liveness_intervals(lv["value_id"].tolist(), lv["storage"].tolist(), lv["owner_id"].tolist(),
                             lv["bytes"].tolist(), lv["first_def"].tolist(), lv["last_use"].tolist())
    if not ivs:
        return ivs, -1, 0
    starts = np.fromiter((iv.start for iv in ivs), np.int64, len(ivs))
    ends = np.fromiter((iv.end for iv in ivs), np.int64, len(ivs))
    sizes = np.fromiter((iv.size for iv in ivs), np.int64, len(ivs))
    times = np.concatenate([starts, ends + 1])
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(np.concatenate([sizes, -sizes])[order])
    last_of_time = np.append(times[1:] != times[:-1], True)  # the total after all events at a time
    times, running = times[last_of_time], running[last_of_time]
    i = int(np.argmax(running))  # the first time the most bytes are live
    return ivs, int(times[i]), int(running[i])


def peak_step(src: Recording | Frames) -> int | None:
    """The step with the highest activation peak (the first such step), None without liveness."""
    f = as_frames(src)
    lv = f.get("liveness")
    best, best_step = -1, None
    for step, g in lv.groupby("step", sort=True):
        _, _, peak = _profile(g)
        if peak > best:
            best, best_step = peak, int(step)
    return best_step


def peak_values(src: Recording | Frames, step: int | None = None) -> pd.DataFrame:
    """The values live at the activation peak of `step` (default: `peak_step`), biggest first.

    Columns (`PEAK_COLUMNS`): step, peak_index (the plan index of the peak), value (an
    owner: the value whose buffer it is), bytes, share (of the peak), kind ("kv" for a
    present KV output, else "activation"), node / op_type (its producer), first_def,
    last_use (extended to its views' and aliases' last use), pinned, shared_with (the
    views and in-place aliases living in that buffer, each counted once here),
    value_id. `bytes` sums to the step's peak (= `Recording.memory_plan(step).lower_bound`).
    """
    f = as_frames(src)
    if step is None:
        step = peak_step(f)
    if step is None:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in PEAK_COLUMNS})
    lv = _step_rows(f, step)
    ivs, t, peak = _profile(lv)
    live = [iv for iv in ivs if iv.start <= t <= iv.end]
    parent = {int(v): int(o) for v, st, o in zip(lv["value_id"], lv["storage"], lv["owner_id"])
              if st in ("view", "alias") and o != v}
    sharers: dict[int, list[str]] = {}
    for v, name in zip(lv["value_id"], lv["value"]):
        if int(v) in parent:
            sharers.setdefault(_root(parent, int(v)), []).append(name)
    by_id = lv.set_index("value_id")
    values = f.get("values").set_index("value_id")
    nodes = f.get("nodes").set_index("plan_index")
    kv = kv_value_ids(f)
    rows = []
    for iv in sorted(live, key=lambda iv: (-iv.size, iv.start)):
        vid = int(iv.key)
        r = by_id.loc[vid]
        fd = int(r["first_def"])
        node = nodes["name"].get(fd, "") if fd >= 0 else ""
        op = nodes["op_type"].get(fd, "") if fd >= 0 else ""
        rows.append((int(step), int(t), values["name"].get(vid, f"#{vid}"), int(iv.size),
                     iv.size / peak if peak else np.nan, "kv" if vid in kv else "activation", node, op, fd,
                     int(iv.end), bool(r["pinned"]), sharers.get(vid, []), vid))
    return pd.DataFrame(rows, columns=PEAK_COLUMNS)


def resident_breakdown(src: Recording | Frames, step: int | None = None) -> pd.DataFrame:
    """What one step's memory is made of: "why is memory N x the model file?".

    One row per category (`RESIDENT_CATEGORIES`): weights (initializers: what the model
    file holds), kv_cache (past inputs fed + present outputs made; a past/present pair
    sharing one buffer counts twice unless the recording has `io_buffers`),
    activations (every other buffer the executor holds: one per value, kept across
    steps so captured graphs keep their addresses), inputs (other graph inputs), workspace
    (copies kernels needed: materializations). Columns: step, category, bytes, share
    (of the total), x_weights (bytes / weights bytes), note. Then a row "total", and
    informational rows (share NaN): "activation peak (liveness)" -- the least a
    liveness-based allocator would need for the activations -- and "resident peak
    (recorded)" as the executor reported it. Default step: the last one.
    """
    f = as_frames(src)
    steps = f.get("steps")
    cols = ["step", "category", "bytes", "share", "x_weights", "note"]
    if step is None:
        if steps.empty:
            return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
        step = int(steps["step"].iloc[-1])
    lv = _step_rows(f, step)
    kv = kv_value_ids(f)
    is_kv = lv["value_id"].isin(kv)
    st = lv["storage"]
    b = lv["bytes"].astype("int64")
    io = f.optional("io_buffers")
    kv_bytes = int(b[is_kv & st.isin(["input", "owner"])].sum())
    kv_note = "past inputs + present outputs"
    if io is not None:
        rows_io = io[(io["step"] == step) & io["value_id"].isin(kv)]
        if not rows_io.empty and "base_address" in rows_io:
            uniq = rows_io.drop_duplicates("base_address")
            kv_bytes = int(uniq["base_nbytes"].fillna(uniq["nbytes"]).sum())
            kv_note = "distinct KV buffers (io_buffers addresses)"
    mats = f.get("materializations")
    parts = {
        "weights": (int(b[st == "initializer"].sum()), "initializers (the model file's tensors)"),
        "kv_cache": (kv_bytes, kv_note),
        "activations": (int(b[(st == "owner") & ~is_kv].sum()), "one buffer per value, kept across steps"),
        "inputs": (int(b[(st == "input") & ~is_kv].sum()), "graph inputs other than the KV cache"),
        "workspace": (int(mats.loc[mats["step"] == step, "bytes"].sum()), "copies kernels needed"),
    }
    total = sum(v for v, _ in parts.values())
    weights = parts["weights"][0]
    rows = [(int(step), k, v, v / total if total else np.nan, v / weights if weights else np.nan, note)
            for k, (v, note) in parts.items()]
    rows.append((int(step), "total", total, 1.0 if total else np.nan, total / weights if weights else np.nan,
                 "sum of the rows above"))
    _, _, peak = _profile(lv)
    rows.append((int(step), "activation peak (liveness)", peak, np.nan, peak / weights if weights else np.nan,
                 "the least a liveness-based allocator needs for the activations"))
    srow = steps[steps["step"] == step]
    resident = int(srow["resident_peak_bytes"].iloc[0]) if not srow.empty else 0
    rows.append((int(step), "resident peak (recorded)", resident, np.nan,
                 resident / weights if weights else np.nan, "the executor's own high-water mark of its buffers"))
    return pd.DataFrame(rows, columns=cols)

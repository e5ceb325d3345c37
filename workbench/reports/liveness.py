"""Buffer liveness at one step: value lifetimes, the live-bytes curve, planner peak and bound."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..trace.memory import liveness_intervals
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["MEMORY_MEASURES", "in_place_at", "live_bytes_curve", "memory_at", "lifetimes_at", "values_of_node"]

#: what each memory number measures (the liveness figure's hover and legend say it)
MEMORY_MEASURES = {
    "planner peak": "the arena a liveness-based allocator would need for this step's activations: every owner "
                    "buffer, 64-byte aligned, alive from its producer to the last use of it and its views",
    "lower bound": "the most activation bytes alive at once at this step: no allocator can do with less",
    "resident peak": "the most bytes the executor's own buffers held during the step (every slot's buffers, "
                     "kept across steps; outputs written into caller-bound buffers such as the KV cache are "
                     "not its own, so it can be below the planner peak)",
    "one buffer per value": "every activation owner's own bytes, never reused",
}


def lifetimes_at(src: Recording | Frames, step: int, constants: bool = False) -> pd.DataFrame:
    """One row per value at `step`, ordered by definition: what the Gantt draws.

    Columns: value, storage, owner, bytes, start (first_def; -1 = before the plan),
    end (last_use, at least start), pinned, released_at, category ("owner",
    "owner (pinned)", "view", "alias", "input", "initializer", + " (released)"),
    value_id, owner_id. Initializers (weights and constants: not activations) are left
    out unless `constants`.
    """
    f = as_frames(src)

    def build() -> pd.DataFrame:
        lv = f.get("liveness")
        lv = lv[lv["step"] == step]
        out = pd.DataFrame({
            "value": lv["value"], "storage": lv["storage"], "owner": lv["owner"],
            "bytes": lv["bytes"].astype("int64"), "start": lv["first_def"].astype("int64"),
            "end": np.maximum(lv["last_use"].astype("int64"), lv["first_def"].astype("int64")),
            "pinned": lv["pinned"].astype(bool), "released_at": lv["released_at"].astype("int64"),
            "value_id": lv["value_id"], "owner_id": lv["owner_id"],
        })
        cat = out["storage"].where(~(out["pinned"] & (out["storage"] == "owner")), "owner (pinned)")
        cat = cat.where(out["released_at"] < 0, cat.astype(str) + " (released)")  # str: an empty frame is float
        out.insert(8, "category", cat)
        if not constants:
            out = out[out["storage"] != "initializer"]
        return out.sort_values(["start", "end", "value"], kind="stable").reset_index(drop=True)

    return f.memo(("lifetimes", step, constants), build)


def live_bytes_curve(src: Recording | Frames, step: int) -> pd.DataFrame:
    """Bytes of activation buffers live at each plan index of `step`.

    Columns: plan_index, live_bytes (owners whose interval -- producer to last use of
    the value or of any view/alias into its buffer -- covers the index: what a
    liveness-based allocator must hold), allocated_bytes (one buffer per value, never
    reused: every owner defined so far).
    """
    f = as_frames(src)
    n = len(f.get("nodes"))
    lv = f.get("liveness")
    lv = lv[lv["step"] == step]
    ivs = liveness_intervals(lv["value_id"].tolist(), lv["storage"].tolist(), lv["owner_id"].tolist(),
                             lv["bytes"].tolist(), lv["first_def"].tolist(), lv["last_use"].tolist())
    size = max(n, 1)
    delta = np.zeros(size + 1, dtype=np.int64)
    alloc = np.zeros(size + 1, dtype=np.int64)
    for iv in ivs:
        s, e = max(iv.start, 0), min(max(iv.end, iv.start), size - 1)
        if s >= size:
            continue
        delta[s] += iv.size
        delta[e + 1] -= iv.size
        alloc[s] += iv.size
    return pd.DataFrame({"plan_index": np.arange(size), "live_bytes": np.cumsum(delta)[:size],
                         "allocated_bytes": np.cumsum(alloc)[:size]})


def memory_at(src: Recording | Frames, step: int) -> dict[str, Any]:
    """planner_peak_bytes, lower_bound_bytes, one_buffer_per_value_bytes, resident_peak_bytes
    and the winning planner heuristic at `step` (None where there are no liveness rows)."""
    f = as_frames(src)
    plan = f.memory_plan(step)
    steps = f.get("steps")
    row = steps[steps["step"] == step]
    return {
        "planner_peak_bytes": plan.peak if plan else None,
        "lower_bound_bytes": plan.lower_bound if plan else None,
        "one_buffer_per_value_bytes": plan.naive_total if plan else None,
        "resident_peak_bytes": int(row["resident_peak_bytes"].iloc[0]) if not row.empty else None,
        "heuristic": plan.heuristic if plan else None,
    }


def values_of_node(src: Recording | Frames, plan_index: int) -> list[str]:
    """The names of a node's outputs (what the Gantt highlights when a node is selected)."""
    nodes = as_frames(src).get("nodes")
    hit = nodes[nodes["plan_index"] == plan_index]
    return list(hit["outputs"].iloc[0]) if not hit.empty else []


def in_place_at(src: Recording | Frames, step: int) -> pd.DataFrame:
    """Every value stored in place at `step` (storage "alias": it lives in an earlier
    value's buffer -- the Liveness figure's alias bars): `value, into, written_this_step`
    (True when a node dispatched at this step made the in-place write; False when it
    ran inside a replayed device graph or was kept from an earlier step), `plan_index`."""
    f = as_frames(src)
    lt = lifetimes_at(f, step)
    a = lt[lt["storage"] == "alias"]
    ev = f.get("aliases")
    written = set(ev.loc[ev["step"] == step, "value"])
    return pd.DataFrame({"value": a["value"].tolist(), "into": a["owner"].tolist(),
                         "written_this_step": [v in written for v in a["value"]],
                         "plan_index": a["start"].astype("int64").tolist()})

"""pandas views of a Recording (imported lazily: emitting events never imports pandas).

Every frame is a plain `pandas.DataFrame`. Ids are resolved through the static
tables so frames read well: value ids become value NAMES (an id the values table
does not know reads ``"#<id>"``), plan indices get the node's name and op type (an
index outside the plan, e.g. -1 for graph inputs, reads ``""``). The raw ids stay
available in trailing ``*_id`` / ``plan_index`` columns for joins.

Event frames end with ``seq``: the event's position in the Recording's global
emission order (all tables share one counter), so frames can be merged and sorted
to replay exactly what happened, in order.

Shapes and strides are tuples of ints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .recording import STATIC_COLUMNS, TABLE_CODES, TABLE_COLUMNS, TraceError

if TYPE_CHECKING:  # pragma: no cover
    from .recording import Recording

__all__ = [
    "aliases_frame",
    "buffer_events_frame",
    "liveness_frame",
    "materializations_frame",
    "memory_summary_frame",
    "node_timings_frame",
    "static_frame",
    "steps_frame",
    "table_frame",
    "views_frame",
]


def _maps(rec: Recording) -> tuple[dict, dict, dict]:
    if rec._maps is None:
        v, n = rec._static["values"], rec._static["nodes"]
        rec._maps = (dict(zip(v["value_id"], v["name"])),
                     dict(zip(n["plan_index"], n["name"])),
                     dict(zip(n["plan_index"], n["op_type"])))
    return rec._maps


def _value_names(rec: Recording, ids: list) -> list[str]:
    names = _maps(rec)[0]
    out = []
    for v in ids:
        n = names.get(v)
        out.append(n if n is not None else f"#{v}")
    return out


def _node_names(rec: Recording, idx: list) -> list[str]:
    names = _maps(rec)[1]
    return [names.get(i) or "" for i in idx]


def _node_ops(rec: Recording, idx: list) -> list[str]:
    ops = _maps(rec)[2]
    return [ops.get(i) or "" for i in idx]


def _seq(rec: Recording, code: int) -> np.ndarray:
    return np.flatnonzero(np.asarray(rec._order, dtype=np.int32) == code)


def _frame(columns: dict[str, list]) -> pd.DataFrame:
    return pd.DataFrame(columns, columns=list(columns))


def steps_frame(rec: Recording) -> pd.DataFrame:
    """One row per step.

    Columns: step, slot, phase, bindings (dict symbol -> int), wall_ms (NaN while the
    step is open), resident_peak_bytes, then one column per `end_step(**extra)` key
    (in first-seen order; None where a step did not give it).
    """
    s = rec._t["steps"]
    cols: dict[str, list] = {
        "step": list(s["step"]),
        "slot": list(s["slot"]),
        "phase": list(s["phase"]),
        "bindings": [dict(b) for b in s["bindings"]],
        "wall_ms": [w * 1e3 for w in s["wall_s"]],
        "resident_peak_bytes": list(s["resident_peak_bytes"]),
    }
    keys: dict[str, None] = {}
    for e in s["extra"]:
        keys.update(dict.fromkeys(e))
    for k in keys:
        cols[k] = [e.get(k) for e in s["extra"]]
    return _frame(cols)


def static_frame(rec: Recording, name: str) -> pd.DataFrame:
    """The static tables, one row per entry as given to `set_static`.

    nodes: plan_index, name, op_type, domain, kernel ("native" | "host_fallback"),
    produces_view, capture_supported, capture_reason (None when supported),
    capture_detail, inputs, outputs (lists of value names), then any extra keys.
    values: value_id, name, dtype, shape (symbolic string), kind, role ("input" |
    "output" | "initializer" | "intermediate"), then any extra keys.
    """
    if name not in STATIC_COLUMNS:
        raise TraceError(f"unknown static table {name!r}; known: {sorted(STATIC_COLUMNS)}")
    return _frame({c: list(v) for c, v in rec._static[name].items()})


def views_frame(rec: Recording) -> pd.DataFrame:
    """Zero-copy views, one row per view created.

    Columns: step, value (view's name), source (owner buffer's value name), shape,
    strides (tuples; strides in ELEMENTS, may be negative or 0), byte_offset,
    producer (node name), op (its op type), value_id, source_id, plan_index, seq.
    """
    v = rec._t["view"]
    return _frame({
        "step": list(v["step"]),
        "value": _value_names(rec, v["value_id"]),
        "source": _value_names(rec, v["source_id"]),
        "shape": [tuple(x) for x in v["shape"]],
        "strides": [tuple(x) for x in v["strides"]],
        "byte_offset": list(v["byte_offset"]),
        "producer": _node_names(rec, v["plan_index"]),
        "op": _node_ops(rec, v["plan_index"]),
        "value_id": list(v["value_id"]),
        "source_id": list(v["source_id"]),
        "plan_index": list(v["plan_index"]),
        "seq": _seq(rec, TABLE_CODES["view"]),
    })


def liveness_frame(rec: Recording) -> pd.DataFrame:
    """Value lifetimes, one row per value per step.

    Columns: step, value, storage ("owner" | "view" | "alias" | "input" |
    "initializer"), owner (name of the value whose buffer holds it), bytes,
    first_def (producer's plan index, -1 for inputs/initializers), last_use (last
    consumer's plan index, n_nodes for graph outputs), pinned, released_at (plan
    index or -1), value_id, owner_id, seq.
    """
    lv = rec._t["liveness"]
    return _frame({
        "step": list(lv["step"]),
        "value": _value_names(rec, lv["value_id"]),
        "storage": list(lv["storage"]),
        "owner": _value_names(rec, lv["owner_id"]),
        "bytes": list(lv["nbytes"]),
        "first_def": list(lv["first_def"]),
        "last_use": list(lv["last_use"]),
        "pinned": list(lv["pinned"]),
        "released_at": list(lv["released_at"]),
        "value_id": list(lv["value_id"]),
        "owner_id": list(lv["owner_id"]),
        "seq": _seq(rec, TABLE_CODES["liveness"]),
    })


def buffer_events_frame(rec: Recording) -> pd.DataFrame:
    """Buffer events. Columns: step, event ("alloc" | "reuse" | "release" | "pin"),
    value, bytes, plan_index, node (name; "" outside the plan), value_id, seq."""
    b = rec._t["buffer"]
    return _frame({
        "step": list(b["step"]),
        "event": list(b["event"]),
        "value": _value_names(rec, b["value_id"]),
        "bytes": list(b["nbytes"]),
        "plan_index": list(b["plan_index"]),
        "node": _node_names(rec, b["plan_index"]),
        "value_id": list(b["value_id"]),
        "seq": _seq(rec, TABLE_CODES["buffer"]),
    })


def node_timings_frame(rec: Recording) -> pd.DataFrame:
    """Node executions. Columns: step, plan_index, node, op, mode ("eager" |
    "replayed" | "elided"), duration_us, seq."""
    n = rec._t["node_exec"]
    return _frame({
        "step": list(n["step"]),
        "plan_index": list(n["plan_index"]),
        "node": _node_names(rec, n["plan_index"]),
        "op": _node_ops(rec, n["plan_index"]),
        "mode": list(n["mode"]),
        "duration_us": [d * 1e6 for d in n["duration_s"]],
        "seq": _seq(rec, TABLE_CODES["node_exec"]),
    })


def aliases_frame(rec: Recording) -> pd.DataFrame:
    """In-place writes. Columns: step, value (written), into (value whose buffer it
    reused), plan_index, node, value_id, into_id, seq."""
    a = rec._t["alias"]
    return _frame({
        "step": list(a["step"]),
        "value": _value_names(rec, a["value_id"]),
        "into": _value_names(rec, a["into_id"]),
        "plan_index": list(a["plan_index"]),
        "node": _node_names(rec, a["plan_index"]),
        "value_id": list(a["value_id"]),
        "into_id": list(a["into_id"]),
        "seq": _seq(rec, TABLE_CODES["alias"]),
    })


def materializations_frame(rec: Recording) -> pd.DataFrame:
    """Copies a kernel needed. Columns: step, plan_index, node, op, value, bytes,
    reason, value_id, seq."""
    m = rec._t["materialize"]
    return _frame({
        "step": list(m["step"]),
        "plan_index": list(m["plan_index"]),
        "node": _node_names(rec, m["plan_index"]),
        "op": _node_ops(rec, m["plan_index"]),
        "value": _value_names(rec, m["value_id"]),
        "bytes": list(m["nbytes"]),
        "reason": list(m["reason"]),
        "value_id": list(m["value_id"]),
        "seq": _seq(rec, TABLE_CODES["materialize"]),
    })


def memory_summary_frame(rec: Recording, alignment: int = 64,
                         heuristics: list[str] | None = None) -> pd.DataFrame:
    """Activation memory per step: what one buffer per value costs vs a liveness planner.

    Columns: step; one_buffer_per_value_bytes (sum of the bytes of the step's "owner"
    liveness rows; views, aliases, inputs and initializers count 0);
    planner_peak_bytes and lower_bound_bytes (`trace.memory_planner` run on the
    step's owner intervals, each extended to the last use of the views and aliases
    living in its buffer; offsets aligned to `alignment`); resident_peak_bytes (as
    given to `end_step`). The first three are <NA> for a step without liveness rows.
    Steps with identical intervals share one planner run.
    """
    from .memory import one_buffer_per_value_bytes, rows_by_step, step_intervals
    from .memory_planner import plan_offsets

    s = rec._t["steps"]
    by_step = rows_by_step(rec)
    cache: dict[tuple, tuple[int, int]] = {}
    one, peak, lb = [], [], []
    for step in s["step"]:
        idx = by_step.get(step)
        if not idx:
            one.append(pd.NA)
            peak.append(pd.NA)
            lb.append(pd.NA)
            continue
        ivs = step_intervals(rec, step, idx)
        key = tuple((iv.key, iv.size, iv.start, iv.end) for iv in ivs)
        res = cache.get(key)
        if res is None:
            plan = plan_offsets(ivs, alignment, heuristics)
            res = cache[key] = (plan.peak, plan.lower_bound)
        one.append(one_buffer_per_value_bytes(rec, idx))
        peak.append(res[0])
        lb.append(res[1])
    return pd.DataFrame({
        "step": pd.array(list(s["step"]), dtype="int64"),
        "one_buffer_per_value_bytes": pd.array(one, dtype="Int64"),
        "planner_peak_bytes": pd.array(peak, dtype="Int64"),
        "lower_bound_bytes": pd.array(lb, dtype="Int64"),
        "resident_peak_bytes": pd.array(list(s["resident_peak_bytes"]), dtype="int64"),
    })


def table_frame(rec: Recording, name: str) -> pd.DataFrame:
    """A generic table (step + the columns its rows named, None where a row lacked
    one, then seq); or a built-in table's raw id-based columns (+ seq except for
    "steps"); or a static table ("nodes", "values")."""
    g = rec._generic.get(name)
    if g is not None:
        cols = {k: list(v) for k, v in g.cols.items()}
        cols["seq"] = _seq(rec, g.code)
        return _frame(cols)
    if name in TABLE_COLUMNS:
        cols = {k: list(v) for k, v in rec._t[name].items()}
        if name != "steps":
            cols["seq"] = _seq(rec, TABLE_CODES[name])
        return _frame(cols)
    if name in STATIC_COLUMNS:
        return static_frame(rec, name)
    raise TraceError(f"no table {name!r} in this recording; generic tables: {rec.tables}; "
                     f"built-in: {sorted(TABLE_COLUMNS) + sorted(STATIC_COLUMNS)}")

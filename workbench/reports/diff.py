"""Two recordings (or two steps of one) side by side.

    reports.diff(rec_a, rec_b)        # capture on vs off, two models, two switch settings
    reports.diff_steps(rec, a, b)     # what changed between prefill and decode?

Both return one long frame: aspect, item, a, b, changed (+ delta where the values are
numbers), in a fixed aspect order, so `df[df.changed]` is "what is different" and
`df.query("aspect == 'time'")` one comparison. Nodes are matched by name (two models
share no plan indices); a node only one side has reads None on the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .capture import by_reason, declines_at, segments_at
from .coverage import decode_coverage
from .liveness import memory_at
from .plan import plan_at_step
from .source import Frames, as_frames
from .steps import step_info, steps_of_slot

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["DIFF_ASPECTS", "DIFF_COLUMNS", "diff", "diff_steps"]

#: columns of `diff` / `diff_steps`
DIFF_COLUMNS = ["aspect", "item", "a", "b", "changed", "delta"]

#: aspects, in the order rows appear
DIFF_ASPECTS = ("plan", "bindings", "memo", "segments", "declines", "memory", "views", "shapes", "mode", "time")


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None or (isinstance(a, float) and np.isnan(a)) or (isinstance(b, float) and np.isnan(b)):
        return (a is None or (isinstance(a, float) and np.isnan(a))) and \
            (b is None or (isinstance(b, float) and np.isnan(b)))
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.isclose(float(a), float(b)))
    return a == b


def _num(x: Any) -> float | None:
    if isinstance(x, (bool, np.bool_)) or x is None:
        return None
    if isinstance(x, (int, float, np.integer, np.floating)) and not (isinstance(x, float) and np.isnan(x)):
        return float(x)
    return None


class _Rows:
    def __init__(self, tolerance: float = 0.0):
        self.rows: list[tuple] = []
        self.tolerance = tolerance

    def add(self, aspect: str, item: str, a: Any, b: Any, timing: bool = False) -> None:
        a = None if a is pd.NA else a
        b = None if b is pd.NA else b
        na, nb = _num(a), _num(b)
        delta = nb - na if na is not None and nb is not None else None
        if timing and na is not None and nb is not None:
            # times always differ a little: "changed" means by more than `tolerance` (relative)
            changed = abs(nb - na) > self.tolerance * max(abs(na), abs(nb), 1e-12)
        else:
            changed = not _same(a, b)
        self.rows.append((aspect, item, a, b, bool(changed), delta))

    def frame(self, changed_only: bool) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=DIFF_COLUMNS)
        return (df[df["changed"]] if changed_only else df).reset_index(drop=True)


def _segments_text(seg: pd.DataFrame | None) -> str | None:
    if seg is None:
        return None
    return "; ".join(f"{int(r.first_node)}-{int(r.last_node)} {r.kind}" for r in seg.itertuples(index=False))


def _captured_nodes(seg: pd.DataFrame | None) -> int | None:
    if seg is None:
        return None
    cap = seg[seg["kind"] == "captured"]
    return int(cap["node_count"].fillna(0).sum()) if len(cap) else 0


def _decline_counts(dec: pd.DataFrame | None) -> dict[str, int]:
    if dec is None or dec.empty:
        return {}
    return {r.reason: int(r.declines) for r in by_reason(dec).itertuples(index=False)}


def _last_step(f: Frames, slot: str = "primary") -> int | None:
    s = steps_of_slot(f, slot) or steps_of_slot(f)
    return s[-1] if s else None


def _node_time(f: Frames, phases: tuple[str, ...]) -> pd.DataFrame:
    """node name -> median µs and most common mode over the steps of `phases`."""
    t = f.get("node_timings")
    steps = f.get("steps")
    keep = set(steps.loc[steps["phase"].isin(phases), "step"])
    t = t[t["step"].isin(keep)]
    if t.empty:
        return pd.DataFrame(columns=["us", "mode"])
    nodes = f.get("nodes")
    key = dict(zip(nodes["plan_index"], _node_keys(nodes)))
    t = t.assign(node=[key.get(p, n) for p, n in zip(t["plan_index"], t["node"])])
    per = t.groupby(["node", "step"]).agg(us=("duration_us", "sum"), mode=("mode", "last")).reset_index()
    return per.groupby("node").agg(us=("us", "median"), mode=("mode", lambda s: s.value_counts().index[0]))


def _node_keys(nodes: pd.DataFrame) -> list[str]:
    """A name per node that is unique within its plan (an unnamed or repeated name gets
    its plan index and op type)."""
    counts = nodes["name"].value_counts()
    return [n if n and counts.get(n, 0) == 1 else f"#{int(i)} {op} {n or ''}".rstrip()
            for n, i, op in zip(nodes["name"], nodes["plan_index"], nodes["op_type"])]


def _plan_rows(rows: _Rows, fa: Frames, fb: Frames) -> None:
    na, nb = fa.get("nodes"), fb.get("nodes")
    rows.add("plan", "nodes", len(na), len(nb))
    rows.add("plan", "host fallback nodes", int((na["kernel"] == "host_fallback").sum()),
             int((nb["kernel"] == "host_fallback").sum()))
    na, nb = na.assign(name=_node_keys(na)), nb.assign(name=_node_keys(nb))
    names_a, names_b = set(na["name"]), set(nb["name"])
    only_a, only_b = len(names_a - names_b), len(names_b - names_a)
    rows.rows.append(("plan", "nodes only in a", only_a, 0, bool(only_a), -float(only_a)))
    rows.rows.append(("plan", "nodes only in b", 0, only_b, bool(only_b), float(only_b)))
    ops_a, ops_b = na["op_type"].value_counts(), nb["op_type"].value_counts()
    for op in sorted(set(ops_a.index) | set(ops_b.index)):
        rows.add("plan", f"op {op}", int(ops_a.get(op, 0)), int(ops_b.get(op, 0)))
    ia, ib = na.set_index("name"), nb.set_index("name")
    for name in sorted(names_a & names_b):
        for col in ("op_type", "kernel", "capture_supported", "capture_reason"):
            va, vb = ia.at[name, col], ib.at[name, col]
            va = None if va is None or (isinstance(va, float) and np.isnan(va)) else va
            vb = None if vb is None or (isinstance(vb, float) and np.isnan(vb)) else vb
            if not _same(va, vb):
                rows.add("plan", f"{name}: {col}", va, vb)


def diff(rec_a: Recording | Frames, rec_b: Recording | Frames, *, step_a: int | None = None,
         step_b: int | None = None, changed_only: bool = False, tolerance: float = 0.25) -> pd.DataFrame:
    """Two recordings side by side: plan, bindings, memo actions, segments and declines,
    memory, views and per-node time. `DIFF_COLUMNS`: aspect, item, a, b, changed, delta.

    Per step position (the i-th step of each): bindings, memo action. At `step_a` /
    `step_b` (default: each one's last primary step): segments in force (as text, and
    nodes captured), declines by reason, memory (`memory_at`), views created. Over
    the decode steps: median µs and most common mode per node (by name), decode
    median wall ms, capture coverage (time share replayed). Timing rows count as
    changed when they differ by more than `tolerance` (relative).
    """
    fa, fb = as_frames(rec_a), as_frames(rec_b)
    rows = _Rows(tolerance)
    _plan_rows(rows, fa, fb)
    sa, sb = fa.get("steps"), fb.get("steps")
    rows.add("bindings", "steps", len(sa), len(sb))
    for i in range(max(len(sa), len(sb))):
        ba = dict(sa["bindings"].iloc[i]) if i < len(sa) else None
        bb = dict(sb["bindings"].iloc[i]) if i < len(sb) else None
        rows.add("bindings", f"step #{i}", _fmt(ba), _fmt(bb))
    ma, mb = fa.optional("memo_timeline"), fb.optional("memo_timeline")
    for i in range(max(len(sa), len(sb))):
        a = _memo_at(ma, int(sa["step"].iloc[i])) if i < len(sa) else None
        b = _memo_at(mb, int(sb["step"].iloc[i])) if i < len(sb) else None
        rows.add("memo", f"step #{i}", a, b)
    step_a = _last_step(fa) if step_a is None else step_a
    step_b = _last_step(fb) if step_b is None else step_b
    _at_step_rows(rows, fa, fb, step_a, step_b)
    ta, tb = _node_time(fa, ("decode",)), _node_time(fb, ("decode",))
    for name in list(dict.fromkeys(list(ta.index) + list(tb.index))):
        rows.add("mode", name, ta["mode"].get(name), tb["mode"].get(name))
    da = sa.loc[sa["phase"] == "decode", "wall_ms"].dropna()
    db = sb.loc[sb["phase"] == "decode", "wall_ms"].dropna()
    rows.add("time", "decode step median (ms)", float(np.median(da)) if len(da) else None,
             float(np.median(db)) if len(db) else None, timing=True)
    ca, cb = decode_coverage(fa), decode_coverage(fb)
    rows.add("time", "decode time replayed (share)", ca["time_share"], cb["time_share"])
    for name in list(dict.fromkeys(list(ta.index) + list(tb.index))):
        rows.add("time", f"{name} (µs, median)", _f(ta["us"].get(name)), _f(tb["us"].get(name)), timing=True)
    return rows.frame(changed_only)


def _f(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else float(x)


def _fmt(b: dict | None) -> str | None:
    return None if b is None else ", ".join(f"{k}={v}" for k, v in sorted(b.items()))


def _memo_at(memo: pd.DataFrame | None, step: int) -> str | None:
    if memo is None:
        return None
    m = memo[memo["step"] == step]
    return None if m.empty else str(m["action"].iloc[-1])


def _at_step_rows(rows: _Rows, fa: Frames, fb: Frames, step_a: int | None, step_b: int | None) -> None:
    ia = step_info(fa, step_a) if step_a is not None else {}
    ib = step_info(fb, step_b) if step_b is not None else {}
    slot_a, slot_b = ia.get("slot"), ib.get("slot")
    sa = segments_at(fa, step_a, slot_a) if step_a is not None else None
    sb = segments_at(fb, step_b, slot_b) if step_b is not None else None
    rows.add("segments", "segment plan", _segments_text(sa), _segments_text(sb))
    rows.add("segments", "captured segments", None if sa is None else int((sa["kind"] == "captured").sum()),
             None if sb is None else int((sb["kind"] == "captured").sum()))
    rows.add("segments", "eager segments", None if sa is None else int((sa["kind"] != "captured").sum()),
             None if sb is None else int((sb["kind"] != "captured").sum()))
    rows.add("segments", "nodes in captured segments", _captured_nodes(sa), _captured_nodes(sb))
    ra = _decline_counts(declines_at(fa, step_a, slot_a) if step_a is not None else None)
    rb = _decline_counts(declines_at(fb, step_b, slot_b) if step_b is not None else None)
    for reason in sorted(set(ra) | set(rb)):
        rows.add("declines", reason, ra.get(reason, 0), rb.get(reason, 0))
    mem_a = memory_at(fa, step_a) if step_a is not None else {}
    mem_b = memory_at(fb, step_b) if step_b is not None else {}
    for k in ("resident_peak_bytes", "planner_peak_bytes", "lower_bound_bytes", "one_buffer_per_value_bytes"):
        rows.add("memory", k, mem_a.get(k), mem_b.get(k))
    for item, frame in (("views created", "views"), ("in-place writes (dispatched)", "aliases"),
                        ("copies (materializations)", "materializations")):
        rows.add("views", item, _rows_at(fa, frame, step_a), _rows_at(fb, frame, step_b))


def _rows_at(f: Frames, frame: str, step: int | None) -> int | None:
    """Rows of memory table `frame` at `step`; None where the recording kept no memory
    tables (`SessionOptions.trace_memory` off), so a lean trace diffs as unknown, not 0."""
    if not f.memory:
        return None
    table = f.get(frame)
    return int((table["step"] == step).sum())


def diff_steps(src: Recording | Frames, a: int, b: int, *, changed_only: bool = False,
               tolerance: float = 0.25) -> pd.DataFrame:
    """Two steps of one recording side by side (`DIFF_COLUMNS`): bindings per symbol, the
    memo action and reason, segments and declines in force, memory, views, and per node
    (by name): output shapes, mode and µs. What changed between prefill and decode is
    `diff_steps(rec, 0, 1, changed_only=True)`."""
    f = as_frames(src)
    rows = _Rows(tolerance)
    ia, ib = step_info(f, a), step_info(f, b)
    for k in ("slot", "phase"):
        rows.add("plan", k, ia.get(k), ib.get(k))
    ba, bb = ia.get("bindings") or {}, ib.get("bindings") or {}
    for sym in list(dict.fromkeys(list(ba) + list(bb))):
        rows.add("bindings", sym, ba.get(sym), bb.get(sym))
    rows.add("memo", "action", ia.get("memo_action"), ib.get("memo_action"))
    rows.add("memo", "reason", ia.get("memo_reason"), ib.get("memo_reason"))
    _at_step_rows(rows, f, f, a, b)
    pa, pb = plan_at_step(f, a, ia.get("slot")), plan_at_step(f, b, ib.get("slot"))
    pa, pb = pa.assign(name=_node_keys(pa)).set_index("name"), pb.assign(name=_node_keys(pb)).set_index("name")
    names = list(pa.index)
    for name in names:
        rows.add("shapes", name, pa.at[name, "output_shapes"], pb.at[name, "output_shapes"])
    for name in names:
        rows.add("mode", name, pa.at[name, "mode"], pb.at[name, "mode"])
    rows.add("time", "wall (ms)", ia.get("wall_ms"), ib.get("wall_ms"), timing=True)
    for name in names:
        rows.add("time", f"{name} (µs)", _f(pa.at[name, "duration_us"]), _f(pb.at[name, "duration_us"]),
                 timing=True)
    return rows.frame(changed_only)

"""`find`: a node or value by name -- what the workbench's search box jumps to."""

from __future__ import annotations

import pandas as pd

from ...reports import Frames

__all__ = ["SEARCH_COLUMNS", "find"]

#: columns of `find`
SEARCH_COLUMNS = ["kind", "name", "plan_index", "op_type", "detail"]


def find(frames: Frames, query: str, limit: int = 50) -> pd.DataFrame:
    """Nodes and values whose name contains `query` (case-insensitive; every word must
    match): exact matches first, then names containing `query` as typed (case and all),
    then the rest; nodes before values; then plan order.

    Columns (`SEARCH_COLUMNS`): kind ("node" | "value"), name, plan_index (the node;
    for a value, its producer -- or its first reader when it is a graph input or an
    initializer; -1 when nothing reads it), op_type (that node's), detail.
    """
    words = query.lower().split()
    if not words:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in SEARCH_COLUMNS})
    nodes = frames.get("nodes")
    values = frames.get("values")
    rows = []
    for r in nodes.itertuples(index=False):
        name = str(r.name or "")
        low = name.lower()
        if all(w in low for w in words):
            rows.append((_rank(name, query), 0, int(r.plan_index), "node", name,
                         int(r.plan_index), r.op_type, f"#{int(r.plan_index)} {r.op_type}"))
    producer, reader = {}, {}
    for p, ins, outs in zip(nodes["plan_index"], nodes["inputs"], nodes["outputs"]):
        for o in outs:
            producer.setdefault(o, int(p))
        for i in ins:
            reader.setdefault(i, int(p))
    ops = dict(zip(nodes["plan_index"], nodes["op_type"]))
    for r in values.itertuples(index=False):
        name = str(r.name)
        low = name.lower()
        if not all(w in low for w in words):
            continue
        if name in producer:
            p, how = producer[name], "made by"
        else:
            p, how = reader.get(name, -1), f"{r.role}, first read by"
        detail = f"{r.dtype} {r.shape} · {how} #{p} {ops.get(p, '')}" if p >= 0 else f"{r.dtype} {r.shape} · unused"
        rows.append((_rank(name, query), 1, p, "value", name, p, ops.get(p, ""), detail))
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    return pd.DataFrame([x[3:] for x in rows[:limit]], columns=SEARCH_COLUMNS)


def _rank(name: str, query: str) -> int:
    q = query.strip()
    if name == q or name.lower() == q.lower():
        return 0
    return 1 if q in name else 2

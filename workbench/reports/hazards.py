"""Alias hazards: a write into a buffer that still backs a live value or view.

    reports.alias_hazards(rec)   # empty in a sound run

A node writes its outputs' buffers (a view writes nothing: it only points into its
owner). The buffers a step's values live in are known from its liveness rows: a
view or an in-place alias lives in its owner's buffer (followed through chains to
the root owner). When the recording has the optional `io_buffers` table
(step, value_id, role, address, nbytes[, base_address, base_nbytes]), values whose
address ranges overlap share a buffer too -- e.g. a KV cache fed as a past input
and bound as the present output.

A write at plan index k of value w into buffer B is a hazard when another value x
living in B was defined before k (first_def < k; inputs and initializers count as
defined before the plan) and is still read after it (last_use > k): x's contents
change under its readers. Reading and writing in the same node (an in-place
kernel consuming its input for the last time) is not a hazard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["HAZARD_COLUMNS", "alias_hazards", "buffer_groups"]

#: columns of `alias_hazards`
HAZARD_COLUMNS = ["step", "slot", "plan_index", "node", "op_type", "write", "value", "buffer", "victim",
                  "victim_storage", "victim_first_def", "victim_last_use", "detail"]


class _Union:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        p = self.parent.setdefault(x, x)
        while p != self.parent.setdefault(p, p):
            self.parent[x] = p = self.parent[p]
        return p

    def join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def buffer_groups(lv: pd.DataFrame, io: pd.DataFrame | None = None) -> dict[int, int]:
    """value id -> a representative of the buffer it lives in, for one step's liveness
    rows (and that step's `io_buffers` rows, when given)."""
    u = _Union()
    for v, st, o in zip(lv["value_id"], lv["storage"], lv["owner_id"]):
        u.find(int(v))
        if st in ("view", "alias") and int(o) != int(v):
            u.join(int(v), int(o))
    if io is not None and not io.empty and "address" in io:
        spans = []
        for r in io.itertuples(index=False):
            a = getattr(r, "address", None)
            if a is None or pd.isna(a):
                continue
            base = getattr(r, "base_address", None)
            base_nb = getattr(r, "base_nbytes", None)
            lo = int(base) if base is not None and not pd.isna(base) else int(a)
            n = int(base_nb) if base_nb is not None and not pd.isna(base_nb) else int(r.nbytes)
            spans.append((lo, lo + max(n, 1), int(r.value_id)))
        spans.sort()
        for i, (_lo, hi, v) in enumerate(spans):
            for lo2, _hi2, v2 in spans[i + 1:]:
                if lo2 >= hi:
                    break
                u.join(v, v2)
    return {v: u.find(v) for v in u.parent}


def alias_hazards(src: Recording | Frames) -> pd.DataFrame:
    """Every write into a buffer that still backs another live value or view.

    Columns (`HAZARD_COLUMNS`): step, slot, plan_index, node, op_type, write ("in place"
    -- an in-place alias row --, "replayed" -- inside a captured graph --, "bound
    output" -- into the caller's array --, or "eager"), value (written), buffer (the
    value owning the buffer), victim (the live value in it), victim_storage,
    victim_first_def, victim_last_use, detail. Empty in a sound run.
    """
    f = as_frames(src)
    lv_all = f.get("liveness")
    if lv_all.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in HAZARD_COLUMNS})
    nodes = f.get("nodes")
    values = f.get("values")
    vid_of = dict(zip(values["name"], values["value_id"]))
    name_of = dict(zip(values["value_id"], values["name"]))
    outputs = {int(p): [vid_of[o] for o in outs if o in vid_of] for p, outs in zip(nodes["plan_index"],
                                                                                    nodes["outputs"])}
    node_name = dict(zip(nodes["plan_index"], nodes["name"]))
    node_op = dict(zip(nodes["plan_index"], nodes["op_type"]))
    steps = f.get("steps").set_index("step")
    t = f.get("node_timings")
    al = f.get("aliases")
    in_place = {(int(s), int(v)) for s, v in zip(al["step"], al["value_id"])}
    io = f.optional("io_buffers")
    rows = []
    t_by_step = dict(tuple(t.groupby("step")))
    io_by_step = dict(tuple(io.groupby("step"))) if io is not None and not io.empty else {}
    for step, lv in lv_all.groupby("step", sort=True):
        step = int(step)
        sio = io_by_step.get(step)
        group = buffer_groups(lv, sio)
        bound = set()
        if sio is not None and "role" in sio:
            bound = {int(v) for v, r in zip(sio["value_id"], sio["role"]) if r == "bound_output"}
        info = {int(v): (st, int(fd), int(lu)) for v, st, fd, lu in zip(lv["value_id"], lv["storage"],
                                                                       lv["first_def"], lv["last_use"])}
        members: dict[int, list[int]] = {}
        for v, g in group.items():
            members.setdefault(g, []).append(v)
        owner_of = {g: min((v for v in ms if info.get(v, ("",))[0] in ("owner", "input", "initializer")),
                           default=g) for g, ms in members.items()}
        ex = t_by_step.get(step)
        if ex is None:
            continue
        slot = steps["slot"].get(step, "")
        for p, mode in zip(ex["plan_index"], ex["mode"]):
            p = int(p)
            if mode == "elided":
                continue
            for w in outputs.get(p, ()):
                st = info.get(w, ("",))[0]
                if st == "view":
                    continue  # a view points into its owner: no bytes are written
                g = group.get(w)
                if g is None:
                    continue
                kind = ("in place" if (step, w) in in_place else "bound output" if w in bound
                        else "replayed" if mode == "replayed" else "eager")
                for x in members[g]:
                    if x == w or x not in info:
                        continue
                    xst, xfd, xlu = info[x]
                    if xfd < p < xlu:
                        rows.append((step, slot, p, node_name.get(p, ""), node_op.get(p, ""), kind,
                                     name_of.get(w, f"#{w}"), name_of.get(owner_of[g], f"#{owner_of[g]}"),
                                     name_of.get(x, f"#{x}"), xst, xfd, xlu,
                                     f"{name_of.get(w, w)!s} is written at plan index {p} into the buffer of "
                                     f"{name_of.get(owner_of[g], owner_of[g])!s}, where {name_of.get(x, x)!s} "
                                     f"({xst}) is still read until plan index {xlu}"))
    return pd.DataFrame(rows, columns=HAZARD_COLUMNS)

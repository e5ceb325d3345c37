"""The execution plan as it ran at one step: shapes, mode, time and segment per node."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pandas as pd

from .capture import segment_of_nodes
from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["PLAN_COLUMNS", "node_group", "plan_at_step", "shapes_at_step", "substitute_shape"]

#: columns of `plan_at_step`, in order
PLAN_COLUMNS = ["plan_index", "name", "op_type", "domain", "kernel", "output_shapes", "mode",
                "duration_us", "timed", "elided_by", "segment", "segment_kind", "segment_state", "group",
                "capture_supported", "capture_reason", "capture_detail", "produces_view",
                "inputs", "outputs"]

_DIM = re.compile(r"\s*,\s*")


def substitute_shape(text: str, bindings: dict[str, int]) -> str:
    """'[batch_size, 4, past_sequence_length, 16]' with the step's bindings -> '[1, 4, 7, 16]'.

    A symbol without a binding (data-dependent, unknown) stays as it is.
    """
    if not isinstance(text, str) or not text.startswith("["):
        return "?" if text is None else str(text)
    inner = text[1:-1].strip()
    if not inner:
        return "[]"
    dims = [str(bindings.get(d, d)) for d in _DIM.split(inner)]
    return "[" + ", ".join(dims) + "]"


def shapes_at_step(src: Recording | Frames, step: int) -> dict[str, str]:
    """Value name -> shape text at `step`: symbols substituted, views' recorded shapes exact."""
    f = as_frames(src)

    def build() -> dict[str, str]:
        steps = f.get("steps")
        row = steps[steps["step"] == step]
        bindings = dict(row["bindings"].iloc[0]) if not row.empty else {}
        values = f.get("values")
        out = {n: substitute_shape(s, bindings) for n, s in zip(values["name"], values["shape"])}
        views = f.get("views")
        v = views[views["step"] == step]
        for name, shape in zip(v["value"], v["shape"]):
            out[name] = "[" + ", ".join(str(int(d)) for d in shape) + "]"
        return out

    return f.memo(("shapes", step), build)


def node_group(kernel: str, capture_supported, capture_reason, segment_kind) -> str:
    """The plan strip's colour group of one node.

    With capture segmentation recorded: "captured" or "eager seam"; host-fallback
    kernels always read "host fallback". Without it: the static verdict,
    "capturable" or "declines: <reason>".
    """
    if kernel == "host_fallback":
        return "host fallback"
    if isinstance(segment_kind, str) and segment_kind:
        return "captured" if segment_kind == "captured" else "eager seam"
    if capture_supported is not None and not bool(capture_supported):
        return f"declines: {capture_reason or 'unsupported'}"
    return "capturable"


def elided_by(mode: str, op_type: str, produces_view: bool) -> str:
    """Which mechanism elided a node (the trace records mode "elided" for three): Stage 2
    elides only pure view nodes; If skipping only If nodes; shape folding the rest."""
    if mode != "elided":
        return ""
    if op_type == "If":
        return "If skip"
    return "Stage 2" if bool(produces_view) else "shape fold"


def _timed(nodes: pd.DataFrame) -> list[str]:
    replayed = nodes["mode"] == "replayed"
    sizes = nodes[replayed].groupby("segment", dropna=False)["plan_index"].transform("size") \
        if "segment" in nodes else None
    out = []
    for i, mode in enumerate(nodes["mode"]):
        if mode == "replayed":
            n = int(sizes.loc[nodes.index[i]]) if sizes is not None else 0
            out.append(f"segment ÷ {n}" if n else "segment share")
        elif mode in ("eager",):
            out.append("node")
        else:
            out.append("")
    return out


def plan_at_step(src: Recording | Frames, step: int, slot: str | None = None) -> pd.DataFrame:
    """Every plan node (plan order) with what it did at `step` (columns `PLAN_COLUMNS`).

    output_shapes: the outputs' shapes at the step; mode/duration_us: from the node
    timings ("not run" when the node did not execute, e.g. an untaken branch);
    timed: what duration_us measures -- "node" (the node's own time), "segment ÷ N" (a
    replayed segment is timed as a whole and each of its N nodes shows an equal share),
    "" (not run or elided); elided_by: which mechanism skipped an elided node -- "Stage 2"
    (a cached view reinstated), "If skip" (an unchanged If, not Stage 2) or "shape fold"
    (a folded shape value), "" otherwise;
    segment / segment_kind / segment_state: the capture segment holding the node for
    the step's slot, <NA> when segmentation was not recorded; group: see `node_group`.
    """
    f = as_frames(src)

    def build() -> pd.DataFrame:
        nodes = f.get("nodes").copy()
        shapes = shapes_at_step(f, step)
        nodes["output_shapes"] = [", ".join(shapes.get(o, "?") for o in outs) for outs in nodes["outputs"]]
        t = f.get("node_timings")
        t = t[t["step"] == step].groupby("plan_index").agg(mode=("mode", "last"),
                                                          duration_us=("duration_us", "sum"))
        nodes = nodes.join(t, on="plan_index")
        nodes["mode"] = nodes["mode"].fillna("not run")
        steps = f.get("steps")
        s_slot = slot
        if s_slot is None:
            row = steps[steps["step"] == step]
            s_slot = row["slot"].iloc[0] if not row.empty else "primary"
        seg = segment_of_nodes(f, step, s_slot)
        if seg is None:
            nodes["segment"] = pd.array([pd.NA] * len(nodes), dtype="Int64")
            nodes["segment_kind"] = None
            nodes["segment_state"] = None
        else:
            nodes = nodes.join(seg, on="plan_index")
        nodes["timed"] = _timed(nodes)
        nodes["elided_by"] = [elided_by(m, o, v) for m, o, v in
                              zip(nodes["mode"], nodes["op_type"], nodes["produces_view"])]
        nodes["group"] = [node_group(k, cs, cr, sk) for k, cs, cr, sk in zip(
            nodes["kernel"], nodes["capture_supported"], nodes["capture_reason"], nodes["segment_kind"])]
        return nodes[PLAN_COLUMNS].reset_index(drop=True)

    return f.memo(("plan", step, slot), build)

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
                "inputs", "outputs", "unknown_dims"]

_DIM = re.compile(r"\s*,\s*")
#: the names ONNX shape inference gives dimensions it cannot name (shown as "?")
UNNAMED_DIM = re.compile(r"^unk__\d+$")


def substitute_shape(text: str, bindings: dict[str, int]) -> str:
    """'[batch_size, 4, past_sequence_length, 16]' with the step's bindings -> '[1, 4, 7, 16]'.

    A named symbol without a binding (data-dependent, e.g. nnz) stays as it is; one ONNX
    shape inference could not name (`unk__0`) reads "?" (`unnamed_dims` gives the symbol).
    """
    if not isinstance(text, str) or not text.startswith("["):
        return "?" if text is None else str(text)
    inner = text[1:-1].strip()
    if not inner:
        return "[]"
    dims = [str(bindings.get(d, "?" if UNNAMED_DIM.match(d) else d)) for d in _DIM.split(inner)]
    return "[" + ", ".join(dims) + "]"


def unnamed_dims(text: str, bindings: dict[str, int]) -> list[str]:
    """The unbound `unk__N` symbols of a shape text (what a "?" stands for, on hover)."""
    if not isinstance(text, str) or not text.startswith("["):
        return []
    return [d for d in _DIM.split(text[1:-1].strip()) if UNNAMED_DIM.match(d) and d not in bindings]


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


def unknown_dims_at_step(src: Recording | Frames, step: int) -> dict[str, list[str]]:
    """Value name -> its `unk__N` symbols still unbound at `step` (shown "?" in shapes)."""
    f = as_frames(src)

    def build() -> dict[str, list[str]]:
        steps = f.get("steps")
        row = steps[steps["step"] == step]
        bindings = dict(row["bindings"].iloc[0]) if not row.empty else {}
        values = f.get("values")
        views = f.get("views")
        exact = set(views.loc[views["step"] == step, "value"])
        return {n: u for n, s in zip(values["name"], values["shape"])
                if n not in exact and (u := unnamed_dims(s, bindings))}

    return f.memo(("unknown_dims", step), build)


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


#: ops the executor's shape folding starts from, and the shape arithmetic it folds after
#: them (mirrors `executor.memo.SHAPE_SOURCES` / `SHAPE_ARITHMETIC`; reports may not import it)
SHAPE_SOURCES = frozenset({"Shape", "Size"})
SHAPE_ARITHMETIC = frozenset({"Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Add", "Sub", "Mul",
                              "Div", "Neg", "Slice", "Reshape", "Identity", "Equal", "Where", "Max",
                              "Min", "Range", "ReduceProd", "Abs"})


def _shape_fold_at_step(f: Frames, elided: set[int]) -> set[int]:
    """The elided nodes shape folding served at one step: an elided Shape/Size, then
    elided shape arithmetic fed only by those nodes' values and initializers (the
    executor's own rule, `memo.shape_fold_nodes`, restricted to what was elided). Shape
    arithmetic that ran although so fed (its buffer is written over in place later in
    the step, so the fold leaves it out) still feeds the chain, as it does there."""
    values = f.get("values")
    inits = set(values.loc[values["role"] == "initializer", "name"])
    nodes = f.get("nodes")
    derived: set[str] = set()
    out: set[int] = set()
    for p, op, dom, ins, outs in zip(nodes["plan_index"], nodes["op_type"], nodes["domain"],
                                     nodes["inputs"], nodes["outputs"]):
        if dom:
            continue
        ins = [i for i in list(ins) if i]
        if op in SHAPE_SOURCES:
            if int(p) not in elided:
                continue
        elif op in SHAPE_ARITHMETIC:
            if not ins or not all(i in derived or i in inits for i in ins) or not any(i in derived for i in ins):
                continue
        else:
            continue
        if int(p) in elided:
            out.add(int(p))
        derived.update(o for o in list(outs) if o)
    return out


def elided_mechanisms(src: Recording | Frames) -> dict[tuple[int, int], str]:
    """(step, plan_index) -> "Stage 2" / "If skip" / "shape fold" for every elided node
    execution. `elided_by` alone would call a folded Unsqueeze (a view op) Stage 2: the
    elided nodes of a step that form shape-fold chains (Shape -> Gather -> Unsqueeze ->
    Concat, see `_shape_fold_at_step`) are the shape fold's, whatever their op."""
    f = as_frames(src)

    def build() -> dict[tuple[int, int], str]:
        t = f.get("node_timings")
        el = t[t["mode"] == "elided"]
        if el.empty:
            return {}
        views = dict(zip(f.get("nodes")["plan_index"], f.get("nodes")["produces_view"]))
        out: dict[tuple[int, int], str] = {}
        for step, g in el.groupby("step"):
            fold = _shape_fold_at_step(f, {int(p) for p in g["plan_index"]})
            for p, o in zip(g["plan_index"], g["op"]):
                out[(int(step), int(p))] = "shape fold" if int(p) in fold else elided_by("elided", o, views.get(p, False))
        return out

    return f.memo("elided_mechanisms", build)


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
    (a folded shape value), "" otherwise; unknown_dims: the `unk__N` symbols a "?" in
    output_shapes stands for (a dimension shape inference could not name);
    segment / segment_kind / segment_state: the capture segment holding the node for
    the step's slot, <NA> when segmentation was not recorded; group: see `node_group`.
    """
    f = as_frames(src)

    def build() -> pd.DataFrame:
        nodes = f.get("nodes").copy()
        shapes = shapes_at_step(f, step)
        nodes["output_shapes"] = [", ".join(shapes.get(o, "?") for o in outs) for outs in nodes["outputs"]]
        unknown = unknown_dims_at_step(f, step)
        nodes["unknown_dims"] = [", ".join(dict.fromkeys(d for o in outs for d in unknown.get(o, [])))
                                 for outs in nodes["outputs"]]
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
        mech = elided_mechanisms(f)
        nodes["elided_by"] = [mech.get((step, int(p)), elided_by(m, o, v)) if m == "elided" else ""
                              for p, m, o, v in zip(nodes["plan_index"], nodes["mode"], nodes["op_type"],
                                                    nodes["produces_view"])]
        nodes["group"] = [node_group(k, cs, cr, sk) for k, cs, cr, sk in zip(
            nodes["kernel"], nodes["capture_supported"], nodes["capture_reason"], nodes["segment_kind"])]
        return nodes[PLAN_COLUMNS].reset_index(drop=True)

    return f.memo(("plan", step, slot), build)

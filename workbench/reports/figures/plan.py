"""The plan strip: every node along the plan, by op type, coloured by segment / verdict."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import color_of, esc, layout, vline

__all__ = ["plan_strip_figure"]


def _hover(r) -> str:
    seg = "" if pd.isna(r.segment) else f"<br>segment {int(r.segment)} ({esc(r.segment_kind)}, {esc(r.segment_state)})"
    dur = "" if pd.isna(r.duration_us) else f" · {r.duration_us:.1f} µs"
    if r.mode == "replayed":
        dur += f" ({esc(r.timed)}: the segment is timed as a whole, its nodes share it evenly)"
    if r.elided_by:
        dur += f" by {esc(r.elided_by)}"
    unk = getattr(r, "unknown_dims", "")
    unknown = f" (? = {esc(unk)}: a dynamic dimension shape inference could not name)" if unk else ""
    why = "" if r.capture_supported or pd.isna(r.capture_supported) else \
        f"<br>static verdict: {esc(r.capture_reason)} — {esc(r.capture_detail)}"
    return (f"<b>#{r.plan_index} {esc(r.name)}</b><br>{esc(r.op_type)} · {esc(r.kernel)}"
            f"<br>outputs {esc(r.output_shapes)}{unknown}<br>{esc(r.mode)}{dur}{seg}{why}")


def plan_strip_figure(plan: pd.DataFrame, selected: int | None = None, title: str = "Execution plan",
                      height: int = 460) -> go.Figure:
    """Top: one marker per node (x = plan index, y = op type, colour = `group`);
    bottom: each node's time at the step, coloured by mode (eager / replayed / elided).
    `customdata` of every point is its plan index (click -> select)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.04)
    hover = [_hover(r) for r in plan.itertuples(index=False)]
    plan = plan.assign(_hover=hover, _op=[esc(o) for o in plan["op_type"]])
    for group, g in plan.groupby("group", sort=True):
        fig.add_trace(go.Scatter(
            x=g["plan_index"], y=g["_op"], mode="markers", name=esc(group),
            marker={"symbol": "square", "size": 9, "color": color_of(group), "line": {"width": 0}},
            hovertext=g["_hover"], hoverinfo="text", customdata=g["plan_index"], legendgroup="group",
        ), row=1, col=1)
    for mode, g in plan.groupby("mode", sort=True):
        # a replayed segment is timed as a whole: each of its nodes shows an equal share
        name = "replayed (µs, segment time ÷ its nodes)" if mode == "replayed" else f"{esc(mode)} (µs)"
        fig.add_trace(go.Bar(
            x=g["plan_index"], y=g["duration_us"].fillna(0), name=name,
            marker={"color": color_of(mode)}, hovertext=g["_hover"], hoverinfo="text",
            customdata=g["plan_index"], legendgroup="mode",
        ), row=2, col=1)
    if selected is not None and selected >= 0:
        vline(fig, selected, color="#d62728", dash="solid", name="selected")
    ops = sorted({esc(o) for o in plan["op_type"]}, reverse=True)
    n_ops = len(ops)
    layout(fig, title, max(height, int((170 + 17 * n_ops) / 0.68)))
    fig.update_layout(barmode="stack", bargap=0.1)
    # every op type gets its label (plotly's automatic ticks drop every other category)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=ops, tickmode="array", tickvals=ops,
                     ticktext=ops, tickfont={"size": 10}, row=1, col=1, title="op type")
    fig.update_yaxes(title="µs", row=2, col=1)
    fig.update_xaxes(title="plan index", row=2, col=1)
    return fig

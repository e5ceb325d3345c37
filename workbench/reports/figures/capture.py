"""Capture segmentation: segments per step (bars over plan index) and declines by reason."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .common import color_of, esc, layout, vline

__all__ = ["declines_figure", "segments_figure"]


def segments_figure(segments: pd.DataFrame, declines: pd.DataFrame | None = None,
                    selected_step: int | None = None, selected_node: int | None = None,
                    title: str = "Capture segments per step", retires: pd.DataFrame | None = None) -> go.Figure:
    """One row per step; a bar per segment from its first to its last node, coloured by
    state (captured / replayed / retired / eager). `declines` (the ones in force at the
    selected step) are drawn as ✕ on that step's row; `customdata` = plan index.
    `retires` (`reports.retire_markers`) puts a marker at each retired segment's first
    node, with its reason written beside it (not only in a hover)."""
    fig = go.Figure()
    seg = segments.copy()
    seg["_hover"] = [f"step {s} · segment {g}<br><b>{esc(st)}</b> ({esc(k)})<br>nodes {a}–{b} ({c})"
                     for s, g, st, k, a, b, c in zip(seg["step"], seg["segment"], seg["state"], seg["kind"],
                                                     seg["first_node"], seg["last_node"], seg["node_count"])]
    for state, g in seg.groupby("state", sort=False):
        fig.add_trace(go.Bar(
            y=g["step"], x=g["last_node"] - g["first_node"] + 1, base=g["first_node"] - 0.5, orientation="h",
            name=esc(state), marker={"color": color_of(str(state)), "line": {"width": 0.5, "color": "white"}},
            hovertext=g["_hover"], hoverinfo="text", customdata=g["first_node"],
        ))
    if declines is not None and not declines.empty and selected_step is not None:
        d = declines[declines["plan_index"] >= 0]
        fig.add_trace(go.Scatter(
            x=d["plan_index"], y=[selected_step] * len(d), mode="markers", name="decline",
            marker={"symbol": "x-thin", "size": 9, "line": {"width": 2, "color": "#333"}},
            customdata=d["plan_index"], hoverinfo="text",
            hovertext=[f"<b>#{p} {esc(n)}</b> ({esc(o)})<br>{esc(r)}: {esc(t)}"
                       for p, n, o, r, t in zip(d["plan_index"], d["node"], d["op_type"], d["reason"],
                                                d["detail"])],
        ))
    if retires is not None and not retires.empty:
        fig.add_trace(go.Scatter(
            x=retires["first_node"], y=retires["step"], mode="markers+text", name="retire",
            marker={"symbol": "triangle-left", "size": 10, "color": color_of("retired")},
            text=[esc(t) for t in retires["label"]], textposition="middle right",
            textfont={"size": 10, "color": color_of("retired")}, customdata=retires["first_node"],
            hovertext=[esc(t) for t in retires["label"]], hoverinfo="text",
        ))
    if selected_step is not None:
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=selected_step - 0.5, y1=selected_step + 0.5,
                      line={"color": "#d62728", "width": 1.5}, fillcolor="rgba(0,0,0,0)")
    if selected_node is not None and selected_node >= 0:
        vline(fig, selected_node, color="#d62728", dash="solid")
    n_steps = seg["step"].nunique()
    layout(fig, title, min(700, 160 + 18 * max(n_steps, 4)))
    fig.update_layout(barmode="overlay", bargap=0.15)
    fig.update_yaxes(title="step", autorange="reversed", dtick=1 if n_steps <= 30 else None)
    fig.update_xaxes(title="plan index")
    return fig


def declines_figure(by_reason: pd.DataFrame, title: str = "Declines by reason") -> go.Figure:
    """Horizontal bars: how many nodes each reason kept out of capture."""
    fig = go.Figure(go.Bar(
        y=[esc(r) for r in by_reason["reason"]], x=by_reason["declines"], orientation="h",
        marker={"color": "#ff7f0e"}, customdata=[esc(r) for r in by_reason["reason"]],
        hovertext=[f"<b>{esc(r)}</b>: {n} node(s)<br>{esc(o)}" for r, n, o in
                   zip(by_reason["reason"], by_reason["declines"], by_reason["op_types"])],
        hoverinfo="text",
    ))
    layout(fig, title, 140 + 26 * max(len(by_reason), 2))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="nodes")
    return fig

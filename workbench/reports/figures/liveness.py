"""Liveness at one step: a Gantt of value lifetimes over the plan, and live bytes."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..liveness import MEMORY_MEASURES
from ..units import fmt_bytes
from .common import byte_scale, color_of, esc, layout, vline

__all__ = ["liveness_figure"]


def liveness_figure(lifetimes: pd.DataFrame, curve: pd.DataFrame, memory: dict,
                    selected_node: int | None = None, highlight: list[str] | None = None,
                    title: str = "Buffer liveness") -> go.Figure:
    """Top: one bar per value from its definition to its last use (row = value, in
    definition order; colour = storage, pinned owners dark, released ones marked ✕);
    bottom: live activation bytes along the plan, one-buffer-per-value bytes, the
    planner's peak and the lower bound."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.66, 0.34], vertical_spacing=0.05)
    lt = lifetimes.reset_index(drop=True)
    lt = lt.assign(row=range(len(lt)), _hover=[
        f"<b>{esc(v)}</b><br>{esc(c)} · {fmt_bytes(b)}<br>defined at {s}, last used at {e}"
        + ("" if o == v else f"<br>lives in {esc(o)}")
        + (f"<br>released at {r}" if r >= 0 else "")
        for v, c, b, s, e, o, r in zip(lt["value"], lt["category"], lt["bytes"], lt["start"], lt["end"],
                                       lt["owner"], lt["released_at"])])
    for cat, g in lt.groupby("category", sort=False):
        fig.add_trace(go.Bar(
            y=g["row"], x=g["end"] - g["start"] + 1, base=g["start"] - 0.5, orientation="h",
            name=esc(cat).replace("alias", "alias (stored in place)", 1),
            marker={"color": color_of(str(cat)), "line": {"width": 0}}, hovertext=g["_hover"], hoverinfo="text",
            customdata=g["start"], legendgroup="storage",
        ), row=1, col=1)
    rel = lt[lt["released_at"] >= 0]
    if not rel.empty:
        fig.add_trace(go.Scatter(x=rel["released_at"], y=rel["row"], mode="markers", name="released",
                                 marker={"symbol": "x-thin", "size": 7, "line": {"width": 1.5}},
                                 hoverinfo="skip"), row=1, col=1)
    if highlight:
        h = lt[lt["value"].isin(highlight)]
        fig.add_trace(go.Bar(
            y=h["row"], x=h["end"] - h["start"] + 1, base=h["start"] - 0.5, orientation="h", name="selected",
            marker={"color": "rgba(0,0,0,0)", "line": {"width": 2, "color": "#d62728"}},
            hovertext=h["_hover"], hoverinfo="text", customdata=h["start"],
        ), row=1, col=1)
    peak = max([int(curve["allocated_bytes"].max() if not curve.empty else 0)] +
               [int(memory[k]) for k in ("planner_peak_bytes", "lower_bound_bytes", "resident_peak_bytes")
                if memory.get(k)])
    div, unit = byte_scale(peak)
    fig.add_trace(go.Scatter(x=curve["plan_index"], y=curve["live_bytes"] / div, mode="lines", line_shape="hv",
                             name=f"live ({unit})", line={"color": "#1f77b4", "width": 2},
                             hovertemplate="node %{x}<br>%{y:.2f} " + unit + " live<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=curve["plan_index"], y=curve["allocated_bytes"] / div, mode="lines",
                             line_shape="hv", name=f"one buffer per value ({unit})",
                             line={"color": "#7f7f7f", "dash": "dot"},
                             hovertemplate="node %{x}<br>%{y:.2f} " + unit + " allocated<extra></extra>"),
                  row=2, col=1)
    x_end = int(curve["plan_index"].max()) if not curve.empty else 0
    # two lines that are often within a percent of each other: each is labelled at its
    # end, the planner's above its line and the bound's below, so both stay readable
    # each line's hover says what it measures (MEMORY_MEASURES): the resident peak counts
    # the executor's own buffers, the planner peak an ideal arena for the step's activations,
    # so the resident peak may sit below the planner's
    for key, label, color, dash, shift, anchor, xa in (
            ("planner_peak_bytes", "planner peak", "#d62728", "dash", 9, "bottom", "right"),
            ("lower_bound_bytes", "lower bound", "#2ca02c", "dot", -9, "top", "right"),
            ("resident_peak_bytes", "resident peak", "#8c564b", "dashdot", 9, "bottom", "left")):
        if memory.get(key) is not None:
            v = memory[key] / div
            what = esc(MEMORY_MEASURES[label])
            fig.add_trace(go.Scatter(x=[0, x_end], y=[v, v], mode="lines", name=f"{label} {fmt_bytes(memory[key])}",
                                     line={"color": color, "dash": dash, "width": 1.5},
                                     hovertemplate=f"<b>{label}: {fmt_bytes(memory[key])}</b><br>{what}<extra></extra>"),
                          row=2, col=1)
            fig.add_annotation(x=x_end if xa == "right" else 0, y=v, xanchor=xa, yanchor=anchor, yshift=shift // 3,
                               showarrow=False, hovertext=what,
                               text=f"{label} {fmt_bytes(memory[key])}", font={"size": 10, "color": color},
                               bgcolor="rgba(255,255,255,0.7)", row=2, col=1)
    if selected_node is not None and selected_node >= 0:
        vline(fig, selected_node, color="#d62728", dash="solid")
    n = len(lt)
    layout(fig, title, min(720, 300 + 3 * n))
    fig.update_layout(barmode="overlay", bargap=0.2)
    fig.update_yaxes(autorange="reversed", showticklabels=n <= 40, title="values (definition order)",
                     row=1, col=1)
    if n <= 40:
        fig.update_yaxes(tickmode="array", tickvals=list(lt["row"]), ticktext=[esc(str(v)[-40:]) for v in lt["value"]],
                         tickfont={"size": 9}, row=1, col=1)
    fig.update_yaxes(title=unit, row=2, col=1)
    fig.update_xaxes(title="plan index", row=2, col=1)
    return fig

"""Mechanism lanes across steps (memo, Stage 2, capture per slot) over per-step latency."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import color_of, esc, layout, vline

__all__ = ["LANE_COLORS", "lane_color", "memo_figure"]

#: one colour per (lane, state): the memo's "replayed", Stage 2's "validated" and the
#: capture lane's "replay" are different facts and never share a colour
LANE_COLORS: dict[str, dict[str, str]] = {
    "memo": {"primed": "#1f77b4", "rebuilt": "#ff7f0e", "replayed": "#aec7e8", "ineligible": "#7f7f7f",
             "disabled": "#c7c7c7"},
    "stage 2": {"none": "#dddddd", "candidate": "#bcbd22", "validated": "#e377c2", "latched": "#d62728"},
    "capture": {"capture": "#2ca02c", "replay": "#17becf", "retire": "#8c564b", "quarantine": "#000000",
                "bake": "#9467bd"},
}


def _lane_kind(lane: str) -> str:
    return "capture" if str(lane).startswith("capture") else str(lane)


def lane_color(kind: str, state: str) -> str:
    return LANE_COLORS.get(kind, {}).get(state) or color_of(f"{kind} {state}")


def memo_figure(lanes: pd.DataFrame, latency: pd.DataFrame, selected_step: int | None = None,
                missing: list[str] | None = None, title: str = "Mechanisms per step") -> go.Figure:
    """Top: one lane per mechanism, a marker per step coloured by action/state (events of
    one kind at one step are merged: "replay ×7"); bottom: wall time per step by phase.
    `missing` names lanes that were not recorded (shown as a note, never drawn)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.55, 0.45], vertical_spacing=0.06)
    if not lanes.empty:
        merged = (lanes.groupby(["lane", "step", "state"], sort=False)
                  .agg(count=("detail", "size"), detail=("detail", "first")).reset_index())
        merged["_hover"] = [
            f"step {s} · {esc(lane)}<br><b>{esc(st)}</b>{' ×' + str(c) if c > 1 else ''}<br>{esc(d)}"
            for s, lane, st, c, d in zip(merged["step"], merged["lane"], merged["state"], merged["count"],
                                         merged["detail"])]
        merged["_kind"] = [_lane_kind(x) for x in merged["lane"]]
        for (kind, state), g in merged.groupby(["_kind", "state"], sort=False):
            fig.add_trace(go.Scatter(
                x=g["step"], y=[esc(x) for x in g["lane"]], mode="markers", name=f"{kind} {esc(state)}",
                marker={"symbol": "square", "size": 13, "color": lane_color(kind, str(state))},
                hovertext=g["_hover"], hoverinfo="text", customdata=g["step"], legendgroup="state",
            ), row=1, col=1)
    for phase, g in latency.groupby("phase", sort=False):
        fig.add_trace(go.Bar(
            x=g["step"], y=g["wall_ms"], name=f"{esc(phase) or 'run'} (ms)", marker={"color": color_of(phase)},
            customdata=g["step"], hovertemplate="step %{x}<br>%{y:.3f} ms<extra>" + esc(phase) + "</extra>",
        ), row=2, col=1)
    if selected_step is not None:
        vline(fig, selected_step, color="#d62728", dash="solid", name="selected")
    if missing:
        fig.add_annotation(text="<br>".join(f"{esc(m)}: not recorded in this recording" for m in missing),
                           xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="top",
                           showarrow=False, font={"size": 11, "color": "#7f7f7f"}, align="right")
    layout(fig, title, 440)
    order = [esc(x) for x in dict.fromkeys(lanes["lane"])] if not lanes.empty else []
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=order[::-1], row=1, col=1)
    fig.update_yaxes(title="wall ms", row=2, col=1)
    fig.update_xaxes(title="step", dtick=1 if len(latency) <= 40 else None, row=2, col=1)
    return fig

"""The step breakdown as stacked bars: where each step's wall time went."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .common import esc, layout

__all__ = ["breakdown_figure"]

#: one colour per part of `reports.anatomy.STEP_PARTS`
_PART_COLOR = {"kernels": "#1f77b4", "seams": "#ff7f0e", "replay": "#2ca02c", "capture": "#d62728",
               "shapes": "#9467bd", "executor": "#7f7f7f"}


def breakdown_figure(parts: pd.DataFrame, title: str = "Where each step's wall time went") -> go.Figure:
    """Stacked bars per step: µs of each part (`reports.step_parts`); the bars reach the
    step's wall time (a negative executor remainder is drawn below zero); customdata = step."""
    fig = go.Figure()
    for part, color in _PART_COLOR.items():
        us = parts[f"{part}_us"]
        fig.add_trace(go.Bar(
            x=parts["step"], y=us, name=part, marker={"color": color}, customdata=parts["step"],
            hovertext=[f"step {s} ({esc(p) or 'run'}) · {part}: {u:.1f} µs of {w:.1f} µs"
                       for s, p, u, w in zip(parts["step"], parts["phase"], us, parts["wall_us"])],
            hoverinfo="text"))
    layout(fig, title, 320)
    fig.update_layout(barmode="relative")
    fig.update_xaxes(title="step", dtick=1 if len(parts) <= 40 else None)
    fig.update_yaxes(title="wall time (µs)")
    return fig

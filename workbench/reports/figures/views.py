"""The teaching drawing: a view's walk over its source buffer's elements."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..views import ViewWalk
from .common import esc, layout

__all__ = ["view_walk_figure"]


def view_walk_figure(walk: ViewWalk, title: str | None = None) -> go.Figure:
    """The source buffer as a grid (row-major, `walk.cols` elements per row); each cell
    the view reads is coloured by the position of the view element that reads it
    (untouched cells stay blank) and a line follows the view's order."""
    first, visits = walk.grid()
    z = np.where(first >= 0, first, np.nan).astype(float)
    rows = np.arange(walk.rows)
    label_rows = [f"{walk.first_element + r * walk.cols}" for r in rows]
    text = None
    if walk.rows * walk.cols <= 400:
        text = [[("" if f < 0 else (f"{f}" if v == 1 else f"{f} ×{v}")) for f, v in zip(fr, vr)]
                for fr, vr in zip(first, visits)]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(walk.cols)), y=label_rows, colorscale="Viridis", xgap=1, ygap=1,
        colorbar={"title": {"text": "view<br>element"}}, text=text,
        texttemplate="%{text}" if text is not None else None, textfont={"size": 9},
        hovertemplate="source element %{y} + %{x}<br>read by view element %{z}<extra></extra>",
    ))
    local = walk.order - walk.first_element
    inside = (local >= 0) & (local < walk.rows * walk.cols)
    path = local[inside][:2000]
    fig.add_trace(go.Scatter(
        x=path % walk.cols, y=[label_rows[i] for i in path // walk.cols], mode="lines",
        line={"color": "rgba(214,39,40,0.7)", "width": 1.5}, name="walk order", hoverinfo="skip",
    ))
    if title is None:
        title = (f"{esc(walk.value)}: shape {list(walk.shape)}, strides {list(walk.strides)}, "
                 f"offset {walk.element_offset} → over {esc(walk.source)}")
    layout(fig, title, min(620, 170 + 22 * walk.rows))
    fig.update_yaxes(autorange="reversed", type="category", title="source element (row start)")
    fig.update_xaxes(title="+ column", dtick=1 if walk.cols <= 32 else None)
    fig.update_layout(showlegend=False)
    return fig

"""The teaching drawing: a view's walk over its source buffer's elements."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ..views import ViewWalk
from .common import esc, layout

__all__ = ["MAX_GRID", "view_walk_figure"]

#: at most this many cell columns and rows are drawn; a larger source is aggregated
#: into blocks of source elements (one cell per block), so cells and labels stay legible
MAX_GRID = 32
#: cells carry their view-element number only when they are this few (wide enough to read)
_TEXT_COLS, _TEXT_ROWS = 16, 24
_MAX_ROW_LABELS = 16


def _short(name: str, n: int) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1):]


def view_walk_figure(walk: ViewWalk, title: str | None = None) -> go.Figure:
    """The source buffer as a grid (row-major, `walk.cols` elements per row); each cell
    the view reads is coloured by the position of the view element that reads it first
    (untouched cells stay blank) and a line follows the view's order. A source wider or
    taller than `MAX_GRID` cells is drawn in blocks (one cell = br x bc source elements,
    coloured by the first view element reading any of them); cell numbers appear only on
    small grids and at most `_MAX_ROW_LABELS` rows are labelled."""
    first, visits = walk.grid()
    bc = max(1, math.ceil(walk.cols / MAX_GRID))
    br = max(1, math.ceil(walk.rows / MAX_GRID))
    R, C = math.ceil(walk.rows / br), math.ceil(walk.cols / bc)
    f = np.where(first >= 0, first, np.iinfo(np.int64).max)
    pad_f = np.full((R * br, C * bc), np.iinfo(np.int64).max, dtype=np.int64)
    pad_f[:walk.rows, :walk.cols] = f
    pad_v = np.zeros((R * br, C * bc), dtype=np.int64)
    pad_v[:walk.rows, :walk.cols] = visits
    bf = pad_f.reshape(R, br, C, bc).min(axis=(1, 3))
    bv = pad_v.reshape(R, br, C, bc).sum(axis=(1, 3))
    z = np.where(bf < np.iinfo(np.int64).max, bf, np.nan).astype(float)
    blocked = br > 1 or bc > 1
    row_start = [walk.first_element + r * br * walk.cols for r in range(R)]
    hover = [[(f"source elements {s + c * bc}" + (f"..{s + c * bc + bc - 1}" if bc > 1 else "")
               + (f" (and the next {br - 1} rows)" if br > 1 else "")
               + (f"<br>first read by view element {int(zz)}" if not np.isnan(zz) else "<br>not read")
               + (f"<br>{v} reads" if v > 1 else ""))
              for c, (zz, v) in enumerate(zip(zr, vr))] for s, zr, vr in zip(row_start, z, bv)]
    text = None
    if not blocked and C <= _TEXT_COLS and R <= _TEXT_ROWS:
        text = [[("" if np.isnan(zz) else (f"{int(zz)}" if v == 1 else f"{int(zz)} ×{v}")) for zz, v in zip(zr, vr)]
                for zr, vr in zip(z, bv)]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(C)), y=list(range(R)), colorscale="Viridis", xgap=1, ygap=1,
        colorbar={"title": {"text": "view<br>element"}}, text=text, customdata=hover,
        texttemplate="%{text}" if text is not None else None, textfont={"size": 13 if C <= 6 else 11},
        hovertemplate="%{customdata}<extra></extra>",
    ))
    local = walk.order - walk.first_element
    inside = (local >= 0) & (local < walk.rows * walk.cols)
    path = local[inside]
    px, py = (path % walk.cols) // bc, (path // walk.cols) // br
    if blocked and len(path):  # consecutive reads of one block are one point
        keep = np.r_[True, (np.diff(px) != 0) | (np.diff(py) != 0)]
        px, py = px[keep], py[keep]
    px, py = px[:2000], py[:2000]
    fig.add_trace(go.Scatter(x=px, y=py, mode="lines", line={"color": "rgba(214,39,40,0.7)", "width": 1.5},
                             name="walk order", hoverinfo="skip"))
    head = esc(_short(walk.value, 56)) if title is None else title
    sub = (f"shape {list(walk.shape)}, strides {list(walk.strides)}, offset {walk.element_offset} "
           f"over {esc(_short(walk.source, 40))}")
    if blocked:
        sub += f"<br>each cell: {br} x {bc} source elements"
    layout(fig, f"{head}<br><sup>{sub}</sup>", min(620, max(340, 200 + 22 * R)))
    fig.update_layout(title={"font": {"size": 13}}, margin={"t": 80 if blocked else 64})
    step = max(1, math.ceil(R / _MAX_ROW_LABELS))
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(0, R, step)),
                     ticktext=[str(row_start[r]) for r in range(0, R, step)],
                     title="source element (row start)" if R >= 6 else "row start")
    xstep = max(1, math.ceil(C / 16))
    fig.update_xaxes(title="+ column" if bc == 1 else f"+ column (blocks of {bc})", tickmode="array",
                     tickvals=list(range(0, C, xstep)), ticktext=[str(c * bc) for c in range(0, C, xstep)])
    fig.update_layout(showlegend=False)
    return fig

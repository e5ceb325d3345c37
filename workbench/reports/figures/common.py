"""Shared pieces of the plotly figures: escaping, colours, byte axes, marker lines.

plotly.js renders a subset of HTML inside text and hover labels, so every string
that comes from a model (node, value and op names, reasons quoting them) goes
through `esc` before it reaches a figure.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

__all__ = ["COLORS", "byte_scale", "color_of", "esc", "layout", "vline"]

#: colour of each group / state / mode / action across every figure
COLORS: dict[str, str] = {
    # plan groups and segment states
    "captured": "#2ca02c", "replayed": "#17becf", "retired": "#d62728", "eager": "#ff7f0e",
    "eager seam": "#ff7f0e", "host fallback": "#d62728", "capturable": "#1f77b4",
    # node modes
    "elided": "#9467bd", "not run": "#c7c7c7",
    # memo actions and stage-2 states
    "primed": "#1f77b4", "rebuilt": "#ff7f0e", "ineligible": "#7f7f7f", "disabled": "#c7c7c7",
    "none": "#c7c7c7", "candidate": "#bcbd22", "validated": "#2ca02c", "latched": "#d62728",
    # capture events
    "capture": "#2ca02c", "replay": "#17becf", "retire": "#d62728", "quarantine": "#8c564b", "bake": "#9467bd",
    # storage kinds
    "owner": "#1f77b4", "owner (pinned)": "#08306b", "view": "#2ca02c", "alias": "#9467bd",
    "input": "#7f7f7f", "initializer": "#c7c7c7",
    # phases
    "prefill": "#8c564b", "decode": "#1f77b4", "verify": "#e377c2",
}
_FALLBACK = ["#e377c2", "#bcbd22", "#8c564b", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896"]


def esc(x) -> str:
    """A model-derived string made safe for plotly text, hover and tick labels."""
    return html.escape("" if x is None else str(x), quote=True)


def color_of(key: str) -> str:
    """The colour of a group; "declines: <reason>" and unknown keys get stable fallbacks."""
    if key in COLORS:
        return COLORS[key]
    base = key.split(" (")[0]
    if base in COLORS:
        return COLORS[base]
    if key.startswith("declines:"):
        return "#ff9896" if "host" in key else "#ffbb78"
    return _FALLBACK[sum(map(ord, key)) % len(_FALLBACK)]


def byte_scale(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) for a byte axis whose largest value is `max_bytes`."""
    if max_bytes >= 1 << 30:
        return float(1 << 30), "GiB"
    if max_bytes >= 1 << 20:
        return float(1 << 20), "MiB"
    if max_bytes >= 1 << 10:
        return float(1 << 10), "KiB"
    return 1.0, "B"


def layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    """Common look: compact margins, legend at the right, hover by point."""
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 14}}, height=height, autosize=True,
        margin={"l": 60, "r": 20, "t": 40, "b": 40}, hovermode="closest", template="plotly_white",
        legend={"orientation": "v", "yanchor": "top", "y": 1, "x": 1.01, "xanchor": "left",
                "font": {"size": 11}, "tracegroupgap": 8},
    )
    return fig


def vline(fig: go.Figure, x: float, color: str = "#444", dash: str = "dot", name: str = "") -> None:
    """A vertical marker across the whole plot (the selected step / node)."""
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                  line={"color": color, "width": 1.5, "dash": dash}, name=name or None)

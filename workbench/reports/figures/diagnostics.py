"""Figures of the diagnostic calls: capture coverage per step, seam costs, KV growth, latency."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .common import color_of, esc, layout

__all__ = ["coverage_figure", "kv_growth_figure", "latency_figure", "seam_costs_figure"]

_KIND_COLOR = {"replayed": color_of("replayed"), "eager": color_of("eager"),
               "host_fallback": color_of("host fallback"), "elided": color_of("elided")}


def coverage_figure(cov: pd.DataFrame, title: str = "Capture coverage: node time per step") -> go.Figure:
    """Stacked bars per step: µs of node time replayed / eager / host fallback / elided
    (`reports.capture_coverage`); customdata = step."""
    fig = go.Figure()
    for kind, color in _KIND_COLOR.items():
        us = cov[f"{kind}_us"]
        if not (us > 0).any() and kind != "replayed":
            continue
        fig.add_trace(go.Bar(
            x=cov["step"], y=us, name=kind.replace("_", " "), marker={"color": color}, customdata=cov["step"],
            hovertext=[f"step {s} ({esc(p)}) · {kind.replace('_', ' ')}: {u:.1f} µs, {n} nodes "
                       f"({100 * (sh if sh == sh else 0):.0f}% of node time)"
                       for s, p, u, n, sh in zip(cov["step"], cov["phase"], us, cov[f"{kind}_nodes"],
                                                 cov[f"{kind}_time_share"])],
            hoverinfo="text"))
    layout(fig, title, 300)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="step", dtick=1 if len(cov) <= 40 else None)
    fig.update_yaxes(title="node time (µs)")
    return fig


def seam_costs_figure(by_reason: pd.DataFrame, title: str = "What the seams cost per token") -> go.Figure:
    """Horizontal bars: µs per token per decline reason (`seam_costs(by="reason")`)."""
    label = [f"{esc(r)} · {esc(s)}" for r, s in zip(by_reason["reason"], by_reason["slot"])]
    fig = go.Figure(go.Bar(
        y=label, x=by_reason["us_per_token"], orientation="h", marker={"color": "#ff7f0e"},
        customdata=[esc(r) for r in by_reason["reason"]], hoverinfo="text",
        hovertext=[f"<b>{esc(r)}</b>: {u:.1f} µs/token, {100 * sh:.1f}% of step time<br>{n} seams: {esc(o)}"
                   for r, u, sh, n, o in zip(by_reason["reason"], by_reason["us_per_token"],
                                             by_reason["share_of_step"], by_reason["seams"], by_reason["op_types"])],
    ))
    layout(fig, title, 140 + 26 * max(len(by_reason), 2))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="µs per token")
    return fig


def kv_growth_figure(kv: pd.DataFrame, title: str = "KV cache: used length and capacity per step") -> go.Figure:
    """Lines per step for the first KV pair's past and present: length (solid) and
    capacity (dotted), from `reports.kv_growth`; customdata = step."""
    fig = go.Figure()
    if not kv.empty:
        first = kv["kv"].iloc[0]
        for _io, g in kv[kv["kv"] == first].groupby("io", sort=False):
            name = esc(g["value"].iloc[0])
            fig.add_trace(go.Scatter(x=g["step"], y=g["length"].astype("float"), mode="lines+markers",
                                     name=f"{name} length", customdata=g["step"],
                                     hovertext=[f"step {s}: length {n}, capacity {c}, {esc(h)}"
                                                for s, n, c, h in zip(g["step"], g["length"], g["capacity"],
                                                                      g["how"])], hoverinfo="text"))
            fig.add_trace(go.Scatter(x=g["step"], y=g["capacity"].astype("float"), mode="lines",
                                     line={"dash": "dot"}, name=f"{name} capacity", customdata=g["step"],
                                     hoverinfo="skip"))
    layout(fig, title, 300)
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="positions")
    return fig


def latency_figure(lat: pd.DataFrame, peer_ms: float | None = None,
                   title: str = "Latency per step (wall ms)") -> go.Figure:
    """Wall ms per step coloured by phase; a line at onnxruntime's per-token latency when given."""
    fig = go.Figure()
    for phase, g in lat.groupby("phase", sort=False):
        fig.add_trace(go.Bar(x=g["step"], y=g["wall_ms"], name=esc(phase), marker={"color": color_of(str(phase))},
                             customdata=g["step"], hoverinfo="text",
                             hovertext=[f"step {s} ({esc(phase)}): {w:.3f} ms" for s, w in
                                        zip(g["step"], g["wall_ms"])]))
    if peer_ms is not None:
        fig.add_hline(y=peer_ms, line={"color": "#444", "dash": "dot"},
                      annotation_text=f"onnxruntime {peer_ms:.2f} ms/token")
    layout(fig, title, 280)
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="ms")
    return fig

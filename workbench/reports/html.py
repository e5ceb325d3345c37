"""`to_html(recording, path)`: one self-contained HTML report that opens without a kernel.

plotly.js is inlined once in the head; each figure is a div plus a small script
calling `Plotly.newPlot` with its JSON. Safety: every model-derived string in the
page goes through `html.escape` (tables: `DataFrame.to_html(escape=True)` on text
cells; figures: `figures.common.esc`), and figure JSON additionally has `<`, `>`,
`&` and U+2028/9 written as \\u escapes, so no value can close the script element.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from . import anatomy, capture, liveness, memo, plan, steps, views
from .churn import capture_churn, churn_lines, retire_markers
from .coverage import capture_coverage, seam_costs
from .diff import diff_steps
from .hazards import alias_hazards
from .kv import kv_growth
from .latency import peer_latency
from .peak import peak_values, resident_breakdown
from .peer_profile import join_peer_profile, peer_lines
from .rewrites import REWRITE_RULES, rewrites_line, rewritten_nodes
from .source import MEMORY_NOT_RECORDED, NOT_RECORDED, Frames, as_frames
from .summary import summary
from .units import fmt_bytes, fmt_ms
from .vocabulary import GLOSSARY

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from ..trace import Recording

__all__ = ["figure_json", "glossary_hovers", "render_html", "table_html", "to_html"]

MAX_TABLE_ROWS = 2000

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
nav a{margin-right:12px}.note{color:#666;font-style:italic}.meta{color:#555}
table.tbl{border-collapse:collapse;font-size:12px;margin:8px 0}
table.tbl th,table.tbl td{border:1px solid #e3e3e3;padding:2px 6px;text-align:left;vertical-align:top}
table.tbl th{background:#f5f5f5}details{margin:8px 0}.fig{width:100%}
abbr{text-decoration:underline dotted #999;cursor:help}
"""

#: glossary terms hovered inside a cell's text too (codes, not everyday words)
_IN_TEXT = sorted((t for t in GLOSSARY if "_" in t or t == "Stage 2"), key=len, reverse=True)
_IN_TEXT_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, _IN_TEXT)) + r")(?![A-Za-z0-9_])")
_CELL = re.compile(r"<td>([^<]*)</td>")


def glossary_hovers(table: str) -> str:
    """Wrap jargon in an escaped table's cells in <abbr title="..."> (a hover with the
    glossary sentence): a cell that is exactly a glossary term, and reason codes /
    "Stage 2" inside longer cell text."""

    def abbr(term: str) -> str:
        return f'<abbr title="{html.escape(GLOSSARY[term], quote=True)}">{term}</abbr>'

    def cell(m: re.Match) -> str:
        text = m.group(1)
        if html.unescape(text) in GLOSSARY and html.escape(html.unescape(text)) == text:
            return f"<td>{abbr(text)}</td>"
        return "<td>" + _IN_TEXT_RE.sub(lambda t: abbr(t.group(1)), text) + "</td>"

    return _CELL.sub(cell, table)



def figure_json(fig: go.Figure) -> str:
    """The figure's {"data", "layout"} as JSON that is safe inside a <script> element."""
    import plotly.io as pio

    text = pio.to_json(fig, validate=False, pretty=False)
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                 ("\u2029", "\\u2029")):
        text = text.replace(a, b)
    return text


def _cell(v) -> object:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return v


def table_html(df: pd.DataFrame, max_rows: int = MAX_TABLE_ROWS) -> str:
    """A DataFrame as an escaped HTML table (lists and dicts as text, at most `max_rows`)."""
    more = len(df) - max_rows
    shown = df.head(max_rows).copy()
    for c in shown.columns:
        if shown[c].dtype == object:
            shown[c] = [_cell(v) for v in shown[c]]
    out = glossary_hovers(shown.to_html(index=False, escape=True, border=0, classes="tbl", na_rep="—"))
    if more > 0:
        out += f'<p class="note">{more:,} more rows not shown; see export() for every row.</p>'
    return out


class _Page:
    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.nav: list[tuple[str, str]] = []
        self.n_fig = 0

    def section(self, anchor: str, heading: str) -> None:
        self.nav.append((anchor, heading))
        self.parts.append(f'<h2 id="{anchor}">{html.escape(heading)}</h2>')

    def text(self, s: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{html.escape(s)}</p>')

    def raw(self, s: str) -> None:
        self.parts.append(s)

    def table(self, df: pd.DataFrame, summary_line: str | None = None) -> None:
        t = table_html(df)
        self.parts.append(f"<details><summary>{html.escape(summary_line)}</summary>{t}</details>"
                          if summary_line else t)

    def figure(self, fig: go.Figure) -> None:
        self.n_fig += 1
        div = f"fig-{self.n_fig}"
        self.parts.append(
            f'<div id="{div}" class="fig"></div>\n<script type="text/javascript">(function(){{'
            f'var f={figure_json(fig)};Plotly.newPlot("{div}",f.data,f.layout,{{responsive:true}});'
            f'}})();</script>')

    def render(self, plotly_js: str) -> str:
        nav = " ".join(f'<a href="#{a}">{html.escape(h)}</a>' for a, h in self.nav)
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>{html.escape(self.title)}</title><style>{_CSS}</style>\n"
                f'<script type="text/javascript">{plotly_js}</script>\n</head><body>\n'
                f"<h1>{html.escape(self.title)}</h1><nav>{nav}</nav>\n" + "\n".join(self.parts)
                + "\n</body></html>\n")


def _default_step(f: Frames) -> int | None:
    primary = steps.steps_of_slot(f, "primary") or steps.steps_of_slot(f)
    return primary[-1] if primary else None


def render_html(src: Recording | Frames, step: int | None = None, title: str = "Workbench recording") -> str:
    """The report as a string; see `to_html`."""
    from plotly.offline import get_plotlyjs

    from . import figures

    f = as_frames(src)
    page = _Page(title)
    step = _default_step(f) if step is None else step
    info = steps.step_info(f, step) if step is not None else {"recorded": False}
    slot = info.get("slot") if info.get("recorded") else None

    page.section("summary", "Summary")
    page.table(summary(f)[["section", "metric", "text"]])

    page.section("steps", "Steps")
    st = f.get("steps").copy()
    tok = steps.tokens_frame(f).drop_duplicates("step", keep="last").set_index("step")["token"]
    st["token"] = st["step"].map(tok)
    st["wall"] = [fmt_ms(x) for x in st["wall_ms"]]
    st["resident peak"] = [fmt_bytes(x) for x in st["resident_peak_bytes"]]
    page.table(st[["step", "slot", "phase", "wall", "resident peak", "token", "bindings"]])
    page.figure(figures.latency_figure(steps.latency_frame(f)))

    page.section("mechanisms", "Memo, Stage 2 and capture per step")
    lanes = memo.mechanism_lanes(f)
    missing = [n for n, key in (("decode-plan memo", "memo_timeline"), ("capture events", "capture_events"))
               if not f.has(key)]
    for m in missing:
        page.text(f"{m}: {NOT_RECORDED}.", "note")
    page.figure(figures.memo_figure(lanes, steps.latency_frame(f), step, missing))
    memo_tl = f.optional("memo_timeline")
    if memo_tl is not None:
        page.table(memo_tl, "memo timeline table")

    if step is None:
        page.text("No step was recorded: nothing more to show.", "note")
        return page.render(get_plotlyjs())
    where = f"step {step} ({info.get('phase') or 'run'}, slot {slot})"

    page.section("plan", f"Plan at {where}")
    pl = plan.plan_at_step(f, step, slot)
    page.figure(figures.plan_strip_figure(pl, title=f"Execution plan at {html.escape(where)}"))
    page.table(pl.drop(columns=["inputs", "outputs"]), f"all {len(pl)} nodes")

    page.section("rewrites", "Load-time rewrites")
    rw = rewrites_line(f)
    if rw is None:
        page.text("Load-time rewrites: " + NOT_RECORDED + " (the plan above is the graph as loaded).", "note")
    else:
        page.text(rw[2] + ". These nodes of the loaded graph are not in the plan above: "
                  + "; ".join(f"{k} = {v}" for k, v in REWRITE_RULES.items()) + ".", "meta")
        page.table(rewritten_nodes(f), "nodes folded / fused / removed at load (not in the plan)")
        kept = rewritten_nodes(f, in_plan=True)
        if not kept.empty:
            page.table(kept, f"{len(kept)} nodes kept in the plan, their weights rewritten")

    page.section("capture", "Capture segmentation")
    seg_all = f.optional("segments")
    if seg_all is None:
        page.text(f"Capture segmentation: {NOT_RECORDED}. Static capture verdicts of the plan:", "note")
    else:
        seg_slot = pd.concat([capture.segments_at(f, s, slot) for s in steps.steps_of_slot(f, slot)]
                             or [seg_all.head(0)], ignore_index=True)
        dec = capture.declines_at(f, step, slot)
        page.figure(figures.segments_figure(seg_slot, dec, step, retires=retire_markers(f, slot)))
        if dec is None or dec.empty:
            page.text(f"No declines recorded at or before {where}.", "note")
        else:
            page.figure(figures.declines_figure(capture.by_reason(dec)))
            page.table(dec, f"{len(dec)} declines in force at {where}")
    sv = capture.static_verdicts(f)
    page.table(sv, f"{len(sv)} nodes with a static decline or host-fallback kernel")

    if f.memory:
        _views_and_liveness(page, f, step, where)
    else:
        page.section("views", f"Zero-copy views at {where}")
        page.text(f"Views and in-place writes: {MEMORY_NOT_RECORDED}.", "note")
        page.section("liveness", f"Buffer liveness at {where}")
        page.text(f"Liveness: {MEMORY_NOT_RECORDED}.", "note")
    _diagnostics(page, f, step)
    return page.render(get_plotlyjs())


def _views_and_liveness(page: _Page, f: Frames, step: int, where: str) -> None:
    """The views, in-place writes and liveness sections of a recording with memory tables."""
    from . import figures

    page.section("views", f"Zero-copy views at {where}")
    vw = views.views_at(f, step)
    if vw.empty:
        page.text("No views were created at this step.", "note")
    else:
        page.table(vw, f"{len(vw)} views")
        walk = views.view_walk(f, step, views.most_instructive_view(f, step))
        if walk is not None:
            page.figure(figures.view_walk_figure(walk))
    al = f.get("aliases")
    al = al[al["step"] == step]
    if not al.empty:
        page.table(al, f"{len(al)} in-place writes")

    page.section("liveness", f"Buffer liveness at {where}")
    mem = liveness.memory_at(f, step)
    page.text("planner peak " + fmt_bytes(mem["planner_peak_bytes"]) + " · lower bound "
              + fmt_bytes(mem["lower_bound_bytes"]) + " · one buffer per value "
              + fmt_bytes(mem["one_buffer_per_value_bytes"]) + " · resident peak "
              + fmt_bytes(mem["resident_peak_bytes"]), "meta")
    page.text(" · ".join(f"{k}: {v}" for k, v in liveness.MEMORY_MEASURES.items()) + ".", "note")
    lt = liveness.lifetimes_at(f, step)
    page.text("Weights and constants (initializers) are left out: they are not activations.", "note")
    if lt.empty:
        page.text(f"Liveness: {NOT_RECORDED} for this step.", "note")
    else:
        page.figure(figures.liveness_figure(lt, liveness.live_bytes_curve(f, step), mem))


def _diagnostics(page: _Page, f: Frames, step: int) -> None:
    """The sections of the diagnostic calls (one each), shadow verification and the glossary."""
    from . import figures

    page.section("shadow", "Shadow verification")
    s = summary(f).set_index("metric")
    page.text(str(s.loc["shadow verification", "text"]), "meta")
    checks = f.optional("shadow_checks")
    if checks is None:
        page.text("Run with SessionOptions(shadow='record') to re-run served steps eagerly and compare every "
                  "value.", "note")
    else:
        div = f.optional("divergences")
        if div is not None and not div.empty:
            page.table(div)
        page.table(checks, f"{len(checks)} shadowed steps")
    page.section("hazards", "Alias hazards")
    hz = alias_hazards(f) if f.memory else None
    if hz is None:
        page.text(f"Alias hazards: {MEMORY_NOT_RECORDED}.", "note")
    elif hz.empty:
        page.text("No write into a buffer that still backs a live value or view: none found.", "meta")
    else:
        page.text(f"{len(hz)} writes into a buffer another live value still uses:", "meta")
        page.table(hz)

    page.section("coverage", "Capture coverage")
    cov = capture_coverage(f)
    page.text(str(s.loc["capture coverage (decode, time-weighted)", "text"]) + " over the decode steps.", "meta")
    page.figure(figures.coverage_figure(cov))
    page.table(cov, "coverage per step (counts, µs and shares)")

    _time_section(page, f)

    page.section("churn", "Capture churn")
    churn = capture_churn(f)
    lines = churn_lines(f, limit=10)
    if churn.empty:
        page.text("No captured segment was recorded.", "note")
    elif not lines:
        page.text(f"Every one of the {len(churn)} captured segments was recorded once and then replayed.", "meta")
    else:
        page.text(f"{len(lines)} segments were recorded again after a retire: a graph that keeps being "
                  "re-recorded costs a recording each time and pays nothing back.", "meta")
        for line in lines:
            page.text(line, "note")
    if not churn.empty:
        page.table(churn, "per captured segment: recordings, replays, retires by reason")

    page.section("seams", "Seam costs")
    by_reason = seam_costs(f, by="reason")
    if by_reason.empty:
        page.text(f"Capture segmentation: {NOT_RECORDED}.", "note")
    else:
        page.figure(figures.seam_costs_figure(by_reason))
        page.table(by_reason)
        seams = seam_costs(f)
        page.table(seams, f"{len(seams)} seams, costliest first")

    pk = peak_values(f)
    at = int(pk["step"].iloc[0]) if not pk.empty else None
    page.section("peak", f"Activation peak (step {at})" if at is not None else "Activation peak")
    if pk.empty:
        page.text(f"Liveness: {NOT_RECORDED if f.memory else MEMORY_NOT_RECORDED}.", "note")
    else:
        page.text(f"{fmt_bytes(int(pk['bytes'].sum()))} live at plan index {int(pk['peak_index'].iloc[0])} in "
                  f"{len(pk)} buffers (views counted once, under their owner).", "meta")
        page.table(pk, f"the {len(pk)} values live at the peak, biggest first")
    rb = resident_breakdown(f, step) if f.memory else None  # its categories are liveness rows
    if rb is not None and not rb.empty:
        total = rb.set_index("category").loc["total"]
        page.text(f"Resident at step {step}: {fmt_bytes(int(total['bytes']))}, {float(total['x_weights']):.2f}x "
                  "the weights (the model file).", "meta")
        page.table(rb)

    page.section("kv", "KV cache growth")
    kv = kv_growth(f)
    if kv.empty:
        page.text("No KV cache inputs/outputs were found in this graph.", "note")
    else:
        if not f.memory:
            page.text(f"The buffers' bytes, addresses and copies: {MEMORY_NOT_RECORDED}.", "note")
        page.figure(figures.kv_growth_figure(kv))
        page.table(kv.drop(columns=["value_id"]), f"{len(kv)} rows: every KV value at every step")

    st = f.get("steps")
    pre = st.loc[st["phase"] == "prefill", "step"]
    dec = st.loc[st["phase"] == "decode", "step"]
    if len(pre) and len(dec):
        a, b = int(pre.iloc[0]), int(dec.iloc[-1])
        page.section("diff", f"Prefill vs decode (step {a} vs step {b})")
        d = diff_steps(f, a, b, changed_only=True)
        # collapsed: every node's output shapes differ between prefill and decode (half the page)
        page.table(d[d["aspect"] != "time"], f"{len(d)} differences (click to open); per-node times are left "
                   "out here (see diff_steps)")

    page.section("glossary", "Glossary")
    page.table(pd.DataFrame({"term": list(GLOSSARY), "meaning": list(GLOSSARY.values())}),
               f"{len(GLOSSARY)} terms (hover a term in any table)")


def _time_section(page: _Page, f: Frames) -> None:
    """Where the step time goes (reports.anatomy), onnxruntime's latency and the ratio,
    and its own profile beside ours node by node where the recording carries one."""
    from . import figures

    page.section("time", "Where the step time goes")
    peer = peer_latency(f)
    if peer is None:
        page.text("onnxruntime: no peer measurement in this recording (workbench report and workbench demo "
                  "add one).", "note")
    else:
        page.text(f"{peer['runtime']}: {peer['ms_per_token']:.3f} ms/token through the same loop, timed alike; "
                  f"workbench {peer['ours_ms_per_token']:.3f} ms/token; workbench / {peer['runtime']}: "
                  f"{peer['ratio']:.2f}x.", "meta")
    for line in anatomy.breakdown_lines(f):
        page.text(line, "meta")
    page.text("Parts: " + "; ".join(f"{k}: {v}" for k, v in anatomy.STEP_PARTS.items())
              + ". They sum to each step's wall time; trace overhead is inside executor.", "note")
    for line in anatomy.breakdown_missing(f):
        page.text(line + " (counted as executor time).", "note")
    parts = anatomy.step_parts(f)
    if parts.empty:
        page.text("No finished step was recorded.", "note")
        return
    page.figure(figures.breakdown_figure(parts))
    page.table(anatomy.breakdown_spread(f), None)
    page.table(anatomy.breakdown_spread(f, by="op_type"), "spread per part and op type (p10 / median / p90 µs)")
    page.table(parts, "every step's parts (µs)")
    joined = join_peer_profile(f)
    if not joined.empty:
        for line in peer_lines(f):
            page.text(line, "meta")
        page.table(joined, f"{len(joined)} nodes: ours vs onnxruntime's profile, biggest difference first")


def to_html(src: Recording | Frames, path: str | Path, step: int | None = None,
            title: str = "Workbench recording") -> Path:
    """Write the report for `step` (default: the last primary step) to `path`; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(src, step, title), encoding="utf-8")
    return out



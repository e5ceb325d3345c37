"""`PlanView`: the execution plan at the selected step -- strip, paged table, node details."""

from __future__ import annotations

import html

import ipywidgets as W

from ..reports.figures import plan_strip_figure
from ..reports.rewrites import rewrites_line, rewritten_nodes
from ..reports.units import fmt_us
from .base import RecordingView
from .figure import FigureHolder
from .model import PlanModel
from .table import PagedTable

__all__ = ["PlanView"]


class PlanView(RecordingView):
    """Every node in plan order: op, output shapes at the step, kernel (native / host
    fallback), mode and time, and its capture segment (or static verdict when capture
    segmentation was not recorded). Click a marker to select a node."""

    def _build(self) -> list[W.Widget]:
        self.model = PlanModel(self.frames)
        self.figure = FigureHolder(max_height=540, follows_step=True)
        self.table = PagedTable(size=20, formatters={"duration_us": fmt_us},
                                filter_columns=["name", "op_type", "kernel", "group", "mode"])
        self.table.layout.width = "100%"
        # the detail sits above the table, full width: beside a 66% table it was cut off on
        # the right, and the table's mode / duration / segment columns scrolled off-screen
        self.detail = W.HTML(layout=W.Layout(width="100%"))
        self.detail.add_class("wb-node-detail")
        # the loaded graph's nodes that a load-time rewrite folded / fused / removed: not in the plan
        self.rewrites = W.HTML(layout=W.Layout(width="100%"))
        self.rewrites.add_class("wb-rewrites")
        self.rewrites.value = rewrites_html(self.frames)  # static: shown before any step too
        return [self.figure, self.rewrites, self.detail, self.table]

    def _render(self) -> None:
        c = self.cursor
        plan = self.model.plan(c.step, c.slot)
        self.message.value = ""
        self.figure.show(plan_strip_figure(
            plan, c.node, title=f"Execution plan at step {c.step} ({len(plan)} nodes)"), self.select_node, step=c.step)
        page = None
        if c.node >= 0 and not self.table.query.value:
            page = self.model.page_of_node(c.step, c.slot, c.node, self.table.size)
        node = c.node
        self.table.set_frame(plan[self.table_columns()], page, lambda r: r["plan_index"] == node)
        self.detail.value = node_detail_html(self.model.node(c.step, c.slot, node)) if node >= 0 else \
            "<i>Click a node in the strip (or pick one above) to see its inputs, outputs and verdict.</i>"
        self.rewrites.value = rewrites_html(self.frames)

    @staticmethod
    def table_columns() -> list[str]:
        from .model.plan import TABLE_COLUMNS

        return TABLE_COLUMNS


def node_detail_html(d: dict | None) -> str:
    if d is None:
        return "<i>node not in the plan</i>"
    e = html.escape

    def io(rows):
        return "".join(f"<li><code>{e(n)}</code> {e(s)}</li>" for n, s in rows) or "<li>—</li>"

    verdict = ("capturable" if d["capture_supported"] else
               f"declines: <b>{e(str(d['capture_reason']))}</b> — {e(d['capture_detail'])}")
    why = ""
    if d.get("decline"):  # why it ran eager at this step, beside what the op could do in general
        reason, detail = d["decline"]
        why = (f"<br>why eager at this step: <b>{e(reason)}</b> — {e(detail)}" if reason == "warm-up" else
               f"<br>eager seam at this step, declined: <b>{e(reason)}</b> — {e(detail)}")
    return (f"<div style='padding:4px 12px;border-left:3px solid var(--jp-brand-color1,#d62728);"
            f"overflow-wrap:anywhere'>"
            f"<b>#{d['plan_index']} {e(d['name'])}</b><br>"
            f"{e(d['op_type'])}{(' (' + e(d['domain']) + ')') if d['domain'] else ''} · kernel {e(d['kernel'])}"
            f"{' · produces a view' if d['produces_view'] else ''}<br>"
            f"this step: {e(d['mode'])}, {e(d['duration'])}<br>"
            f"{e(d['segment']) if d['segment'] else 'segment: ' + e(d['group'])}{why}"
            f"<br>static verdict (the op at any step): {verdict}"
            f"<br>inputs<ul>{io(d['inputs'])}</ul>outputs<ul>{io(d['outputs'])}</ul></div>")


def rewrites_html(frames) -> str:
    """The Plan tab's "Load-time rewrites" table: original nodes folded / fused / removed, by rule."""
    line = rewrites_line(frames)
    if line is None:
        return "<p><b>Load-time rewrites</b>: not recorded in this recording.</p>"
    df = rewritten_nodes(frames)
    e = html.escape
    if df.empty:
        kept = rewritten_nodes(frames, in_plan=True)
        return (f"<p><b>Load-time rewrites</b>: {e(line[2])}; no node of the loaded graph was removed"
                + (f" ({len(kept)} nodes kept, their weights rewritten)" if len(kept) else "") + ".</p>")
    rows = "".join(f"<tr><td><code>{e(r.node)}</code></td><td>{e(r.op_type)}</td>"
                   f"<td title='{e(r.what, quote=True)}'>{e(r.rule)}</td><td><code>{e(r.result)}</code></td></tr>"
                   for r in df.head(200).itertuples(index=False))
    more = f"<br><i>first 200 of {len(df)}</i>" if len(df) > 200 else ""
    return (f"<details{' open' if len(df) <= 5 else ''}><summary><b>Load-time rewrites</b>: {e(line[2])}; these nodes of the loaded "
            f"graph are not in the plan</summary><table class='wb-table'><tr><th>original node</th><th>op</th>"
            f"<th>rule</th><th>replaced by</th></tr>{rows}</table>{more}</details>")

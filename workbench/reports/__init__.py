"""Reports: pandas frames derived from a Recording, plotly figures, HTML and file export.

Everything here reads a `workbench.trace.Recording` only (never the executor), so a
saved recording reports the same as a live one:

    from workbench import reports
    reports.summary(recording)            # DataFrame: section, metric, value, text
    reports.to_html(recording, "r.html")  # one self-contained file, no kernel needed
    reports.export(recording, "out/")     # every frame as CSV + parquet

plotly is imported only when a figure or the HTML report is built.
"""

from .capture import by_reason, declines_at, segments_at, static_verdicts
from .coverage import COVERAGE_KINDS, capture_coverage, decode_coverage, seam_costs, tokens_per_step
from .diff import diff, diff_steps
from .export import export
from .hazards import alias_hazards
from .html import render_html, to_html
from .kv import kv_growth, kv_pairs
from .liveness import lifetimes_at, live_bytes_curve, memory_at
from .memo import mechanism_lanes
from .peak import peak_step, peak_values, resident_breakdown
from .plan import plan_at_step, shapes_at_step
from .source import NOT_RECORDED, Frames, as_frames
from .steps import latency_frame, slots, step_info, steps_of_slot, tokens_frame
from .summary import summary, summary_text
from .views import ViewWalk, most_instructive_view, view_walk, views_at
from .vocabulary import COLUMNS, GLOSSARY, canonical, explain

__all__ = [
    "COLUMNS", "COVERAGE_KINDS", "alias_hazards", "GLOSSARY", "canonical", "capture_coverage", "decode_coverage", "diff", "diff_steps", "explain",
    "kv_growth", "kv_pairs", "peak_step", "peak_values", "resident_breakdown", "seam_costs", "tokens_per_step",
    "NOT_RECORDED", "Frames", "ViewWalk", "as_frames", "by_reason", "declines_at", "export", "latency_frame",
    "lifetimes_at", "live_bytes_curve", "mechanism_lanes", "memory_at", "most_instructive_view", "plan_at_step", "render_html",
    "segments_at", "shapes_at_step", "slots", "static_verdicts", "step_info", "steps_of_slot", "summary",
    "summary_text", "tokens_frame", "to_html", "view_walk", "views_at",
]

"""Reports: pandas frames derived from a Recording, plotly figures, HTML and file export.

Everything here reads a `workbench.trace.Recording` only (never the executor), so a
saved recording reports the same as a live one:

    from workbench import reports
    reports.summary(recording)            # DataFrame: section, metric, value, text
    reports.to_html(recording, "r.html")  # one self-contained file, no kernel needed
    reports.export(recording, "out/")     # every frame as CSV + parquet

The questions people bring to other runtimes, one call each (all DataFrames):

    reports.capture_coverage(rec)    # per step: nodes and time replayed / eager / host fallback
    reports.seam_costs(rec)          # which seams cost the most: µs per token, share of step time
    reports.peak_values(rec)         # what is live at the activation peak; resident_breakdown(rec)
    reports.alias_hazards(rec)       # writes into a buffer a live value still uses (empty when sound)
    reports.kv_growth(rec)           # per step and KV input/output: capacity, length, moved, copied
    reports.diff(rec_a, rec_b)       # two recordings side by side; diff_steps(rec, a, b)
    reports.step_breakdown(rec)      # where each step's wall time went; breakdown_spread(rec): p10/median/p90
    reports.to_chrome_trace(rec, p)  # the recording as a Perfetto / chrome://tracing timeline
    reports.peer_profile(path)       # onnxruntime's own profile per node; join_peer_profile(rec, it)

Column names follow one vocabulary (`vocabulary.COLUMNS`, `README.md` beside this file).

plotly is imported only when a figure or the HTML report is built.
"""

from .anatomy import (
    BREAKDOWN_COLUMNS,
    SPREAD_COLUMNS,
    STEP_PARTS,
    breakdown_lines,
    breakdown_missing,
    breakdown_spread,
    step_breakdown,
    step_parts,
)
from .capture import by_reason, declines_at, segments_at, static_verdicts
from .chrome_trace import chrome_trace, to_chrome_trace
from .churn import CHURN_COLUMNS, capture_churn, churn_lines, retire_markers
from .coverage import COVERAGE_KINDS, capture_coverage, decode_coverage, seam_costs, tokens_per_step
from .diff import DIFF_ASPECTS, DIFF_COLUMNS, diff, diff_steps
from .export import export
from .hazards import HAZARD_COLUMNS, alias_hazards
from .html import render_html, to_html
from .kv import KV_COLUMNS, kv_growth, kv_pairs
from .latency import LATENCY_DEFINITION, PEER_TABLE, decode_latency, peer_latency, per_token_ms
from .liveness import lifetimes_at, live_bytes_curve, memory_at
from .memo import mechanism_lanes
from .peak import PEAK_COLUMNS, RESIDENT_CATEGORIES, peak_step, peak_values, resident_breakdown
from .peer_profile import (
    JOIN_COLUMNS,
    PROFILE_COLUMNS,
    join_peer_profile,
    peer_events,
    peer_lines,
    peer_profile,
    recorded_peer_profile,
)
from .plan import plan_at_step, shapes_at_step
from .source import MEMORY_NOT_RECORDED, NOT_RECORDED, Frames, as_frames
from .steps import latency_frame, slots, step_info, steps_of_slot, tokens_frame
from .summary import summary, summary_text
from .views import ViewWalk, most_instructive_view, view_walk, views_at, walk_of
from .vocabulary import COLUMNS, GLOSSARY, canonical, explain

__all__ = [
    "BREAKDOWN_COLUMNS", "JOIN_COLUMNS", "PEER_TABLE", "PROFILE_COLUMNS", "SPREAD_COLUMNS", "STEP_PARTS",
    "breakdown_lines", "breakdown_missing", "breakdown_spread", "chrome_trace", "join_peer_profile", "peer_events",
    "peer_latency", "peer_lines", "peer_profile", "recorded_peer_profile", "step_breakdown", "step_parts",
    "to_chrome_trace",
    "CHURN_COLUMNS", "COLUMNS", "COVERAGE_KINDS", "DIFF_ASPECTS", "DIFF_COLUMNS", "GLOSSARY", "HAZARD_COLUMNS", "KV_COLUMNS", "LATENCY_DEFINITION",
    "MEMORY_NOT_RECORDED", "NOT_RECORDED", "PEAK_COLUMNS", "RESIDENT_CATEGORIES", "alias_hazards", "as_frames", "by_reason",
    "canonical", "capture_churn", "capture_coverage", "churn_lines", "declines_at", "decode_coverage", "decode_latency", "diff", "diff_steps", "explain",
    "export", "Frames", "kv_growth", "kv_pairs", "latency_frame", "lifetimes_at", "live_bytes_curve",
    "mechanism_lanes", "memory_at", "most_instructive_view", "peak_step", "per_token_ms", "peak_values", "plan_at_step",
    "render_html", "resident_breakdown", "retire_markers", "seam_costs", "segments_at", "shapes_at_step", "slots",
    "static_verdicts", "step_info", "steps_of_slot", "summary", "summary_text", "to_html", "tokens_frame",
    "tokens_per_step", "view_walk", "views_at", "ViewWalk", "walk_of",
]

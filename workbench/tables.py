"""The columns of every generic trace table the executor writes, defined once.

A generic table (`Recording.add_row` / `add_rows`) is named by a string and its
columns by the rows that reach it. The executor writes these tables, the trace
stores them, reports read them back; so their columns live here, at the bottom of
the layers beside `reasons.py`, which every layer may import: the executor may not
import `trace` (it sits above the executor in DESIGN.md's order), nor `trace` the
executor. Each tuple is the column order of one row as written (the table's `step`
column comes first in a frame, added by the Recording). This module imports nothing.
"""

from __future__ import annotations

#: one segment of a slot's capture segmentation at a step (a captured run of nodes or
#: an eager seam; the whole plan as one eager segment while nothing is captured)
CAPTURE_SEGMENTS_COLUMNS = ("slot", "segment", "first_node", "last_node", "node_count", "kind", "state")
#: one capture lifecycle event of a slot: capture, replay, retire, quarantine or bake
CAPTURE_EVENTS_COLUMNS = ("slot", "segment", "event", "reason", "duration_s")
#: one node kept out of the captured segments, with its decline reason (`reasons.py`)
CAPTURE_DECLINES_COLUMNS = ("slot", "segment", "plan_index", "node", "op_type", "domain", "reason",
                            "detail", "symbols")
#: one run of an If branch as a graph of its own: where the If is, then what the
#: branch's executor did (`CaptureRunner.branch_fields`)
BRANCH_CAPTURE_COLUMNS = ("slot", "plan_index", "node", "branch", "nodes", "replayed_nodes", "replayed_us",
                          "captures", "replays", "retires", "seams", "eager_us")
#: one caller-facing array of a step (a feed, bound output or graph output) and the
#: buffer at the bottom of its view chain
IO_BUFFERS_COLUMNS = ("value_id", "role", "address", "nbytes", "base_address", "base_nbytes")
#: one step's decode-plan memo action (Stage 1) and cached view plan state (Stage 2)
MEMO_COLUMNS = ("slot", "phase", "action", "reason", "varying", "invariant_values", "variant_values",
                "resolve_ms", "stage2", "views_reused", "dispatch_elided", "mismatch_streak")
#: one step checked against eager execution (shadow), and how many values diverged
SHADOW_COLUMNS = ("slot", "checked", "divergences", "mechanisms")
#: one value a mechanism changed, as the shadow check found it
DIVERGENCES_COLUMNS = ("slot", "plan_index", "node", "op_type", "value", "mechanism", "max_abs_err",
                       "shape_expected", "shape_got")

__all__ = ["BRANCH_CAPTURE_COLUMNS", "CAPTURE_DECLINES_COLUMNS", "CAPTURE_EVENTS_COLUMNS",
           "CAPTURE_SEGMENTS_COLUMNS", "DIVERGENCES_COLUMNS", "IO_BUFFERS_COLUMNS", "MEMO_COLUMNS",
           "SHADOW_COLUMNS"]

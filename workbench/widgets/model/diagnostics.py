"""The Diagnostics tab's model: each of the reports' diagnostic calls for a step, one click each."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...reports import (
    Frames,
    alias_hazards,
    capture_coverage,
    diff,
    diff_steps,
    kv_growth,
    peak_values,
    resident_breakdown,
    seam_costs,
    summary,
)
from ...reports.source import MEMORY_NOT_RECORDED
from ...reports.units import fmt_bytes

__all__ = ["CALLS", "DiagnosticsModel"]

#: the tab's buttons -> what each shows
CALLS = {
    "coverage": "capture coverage per step: nodes and time replayed / eager / host fallback",
    "seam costs": "which seams cost the most: µs per token and share of step time",
    "peak values": "the values live at this step's activation peak, views under their owner",
    "resident": "what this step's memory is made of: weights, KV cache, activations, workspace",
    "alias hazards": "writes into a buffer a live value still uses (none in a sound run)",
    "KV growth": "per step and KV input/output: capacity, used length, moved / copied, bytes",
    "diff": "this step against another step (or the recording against `compare`)",
}
#: the calls that read the memory tables (liveness, aliases, buffer events)
MEMORY_CALLS = ("peak values", "resident", "alias hazards")


class DiagnosticsModel:
    """What the Diagnostics tab renders: `frame(call, step, ...)` -> (table, headline)."""

    def __init__(self, frames: Frames, compare: Frames | None = None):
        self.frames = frames
        self.compare = compare

    def frame(self, call: str, step: int, slot: str | None = None, other_step: int | None = None,
              changed_only: bool = True) -> tuple[pd.DataFrame, str]:
        f = self.frames
        if call == "coverage":
            cov = capture_coverage(f)
            s = summary(f).set_index("metric")
            return cov, str(s.loc["capture coverage (decode, time-weighted)", "text"]) + " over the decode steps"
        if call == "seam costs":
            seams = seam_costs(f)
            if seams.empty:
                return seams, "no capture segmentation recorded: no seams to cost"
            top = seams.iloc[0]
            return seams, (f"{len(seams)} seams; costliest: #{int(top['plan_index'])} {top['op_type']} "
                           f"({top['reason']}) {float(top['us_per_token']):.1f} µs per token")
        if call in MEMORY_CALLS and not f.memory:
            return pd.DataFrame(), f"{call}: {MEMORY_NOT_RECORDED}"
        if call == "peak values":
            pv = peak_values(f, step)
            if pv.empty:
                return pv, "no liveness recorded for this step"
            return pv, (f"step {step}: {fmt_bytes(int(pv['bytes'].sum()))} live at plan index "
                        f"{int(pv['peak_index'].iloc[0])} in {len(pv)} buffers")
        if call == "resident":
            rb = resident_breakdown(f, step)
            if rb.empty:
                return rb, "nothing recorded"
            total = rb.set_index("category").loc["total"]
            return rb, (f"step {step}: {fmt_bytes(int(total['bytes']))} resident in all (weights, KV cache, "
                        f"activations, inputs: the session's whole footprint), {float(total['x_weights']):.2f}x "
                        "the weights; Liveness's 'resident peak' is the executor's own buffers only")
        if call == "alias hazards":
            hz = alias_hazards(f)
            return hz, "no alias hazard: every write went into a buffer no live value uses" if hz.empty else \
                f"{len(hz)} writes into a buffer a live value still uses"
        if call == "KV growth":
            kv = kv_growth(f)
            if kv.empty:
                return kv, "no KV inputs/outputs in this graph"
            bytes_note = "" if f.memory else f"; their bytes and copies {MEMORY_NOT_RECORDED}"
            return kv, f"{kv['kv'].nunique()} KV pairs over {kv['step'].nunique()} steps{bytes_note}"
        if call == "diff":
            if self.compare is not None:
                d = diff(f, self.compare, changed_only=changed_only)
                return d, f"this recording (a) vs the compared one (b): {len(d)} rows"
            other = self.default_other(step) if other_step is None else other_step
            if other is None:
                return pd.DataFrame(), "only one step recorded"
            d = diff_steps(f, other, step, changed_only=changed_only)
            return d, f"step {other} (a) vs step {step} (b): {len(d)} rows"
        raise KeyError(f"unknown diagnostic {call!r}; known: {list(CALLS)}")

    def default_other(self, step: int) -> int | None:
        """What `diff` compares a step with: the first prefill step (the previous step
        when the step is that one)."""
        steps = self.frames.get("steps")
        pre = steps.loc[steps["phase"] == "prefill", "step"]
        if len(pre) and int(pre.iloc[0]) != step:
            return int(pre.iloc[0])
        others = [int(s) for s in steps["step"] if int(s) != step]
        earlier = [s for s in others if s < step]
        if earlier:
            return earlier[-1]
        return others[0] if others else None

    def matches_node(self, row: pd.Series, plan_index: int) -> bool:
        """Whether a table row is about node `plan_index` (highlighted when selected)."""
        if plan_index < 0:
            return False
        if "plan_index" in row and _int(row["plan_index"]) == plan_index:
            return True
        name = self._node_name(plan_index)
        return bool(name) and any(row.get(c) == name or (c == "item" and str(row.get(c, "")).startswith(name))
                                  for c in ("node", "item"))

    def _node_name(self, plan_index: int) -> str:
        nodes = self.frames.get("nodes")
        hit = nodes.loc[nodes["plan_index"] == plan_index, "name"]
        return str(hit.iloc[0]) if len(hit) else ""


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None

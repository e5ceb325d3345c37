"""The truth at a glance: one word and one colour per meaning across the tabs, and every
number labelled with the step (or the steps) it is about. Pure pandas.

- a step before a slot's first capture, run eagerly to seed it, is a *warm-up* step:
  its nodes are "warm-up", not "eager seam" (a seam is a node a capture declined);
- a captured node's group is its segment's state at the step ("captured" when the
  graph was recorded, "replayed", ...), the same word -- so the same colour -- as the
  Segmentation tab's bars;
- the Summary's numbers say which step or steps they are about.
"""

from __future__ import annotations

import re

import pandas as pd

from ...reports import Frames, declines_at, segments_at, steps_of_slot

__all__ = ["WARM_UP", "summary_frame", "warm_up_steps", "with_glance_groups", "with_warm_up_states"]

WARM_UP = "warm-up"


def warm_up_steps(frames: Frames, slot: str) -> set[int]:
    """Steps of `slot` before its first capture whose segment plan is one eager segment
    with no decline: the eager warm-up whose just-in-time shapes seed the capture."""
    segs = frames.optional("segments")
    events = frames.optional("capture_events")
    if segs is None or events is None:
        return set()

    def build() -> set[int]:
        ev = events[(events["slot"] == slot) & (events["event"] == "capture")]
        first = int(ev["step"].min()) if len(ev) else None
        out = set()
        for s in steps_of_slot(frames, slot):
            if first is not None and s >= first:
                break
            here = segments_at(frames, s, slot)
            declines = declines_at(frames, s, slot)
            if here is not None and len(here) and (here["kind"] != "captured").all() and (
                    declines is None or declines.empty):
                out.add(int(s))
        return out

    return frames.memo(("warm_up_steps", slot), build)


def with_glance_groups(plan: pd.DataFrame, warm_up: bool) -> pd.DataFrame:
    """`reports.plan_at_step`'s plan with the glance's groups (see the module's doc)."""
    group = plan["group"].copy()
    captured = plan["segment_kind"].eq("captured") & plan["segment_state"].notna() & group.eq("captured")
    group[captured] = plan.loc[captured, "segment_state"].astype(str)
    if warm_up:
        group[group.eq("eager seam")] = WARM_UP
    return plan.assign(group=group)


def with_warm_up_states(segments: pd.DataFrame | None, warm_up: set[int]) -> pd.DataFrame | None:
    """Segments per step with the warm-up steps' eager segments in state "warm-up"."""
    if segments is None or segments.empty or not warm_up:
        return segments
    state = segments["state"].astype(object).copy()
    state[segments["step"].isin(warm_up) & segments["kind"].ne("captured")] = WARM_UP
    return segments.assign(state=state)


def summary_frame(frames: Frames, summary: pd.DataFrame) -> pd.DataFrame:
    """`reports.summary`'s section / metric / text with every total labelled as one:
    the resident peak names its step, counts summed over steps say so, a negative size
    reads as "less"."""
    s = summary[["section", "metric", "text"]].copy()
    steps = frames.get("steps")
    metric, text = s["metric"].astype(str).tolist(), s["text"].astype(str).tolist()
    for i, m in enumerate(metric):
        if m == "resident peak" and len(steps) and steps["resident_peak_bytes"].notna().any():
            row = steps.loc[steps["resident_peak_bytes"].idxmax()]
            metric[i] = f"resident peak (highest step: step {int(row['step'])}, {row['phase'] or 'run'})"
        elif m in ("views reused", "segment captures", "segment replays", "segment retires",
                   "segment quarantines", "segment bakes", "memo primed", "memo rebuilt", "memo replayed",
                   "memo ineligible", "memo disabled"):
            metric[i] = f"{m} (all steps)"
        text[i] = negative_sizes(text[i])
    return s.assign(metric=metric, text=text)


_NEGATIVE = re.compile(r"-(\d[\d.,]*\s*(?:[KMG]i)?B) (\w+)")


def negative_sizes(text: str) -> str:
    """'-20 B resident' -> '20 B less resident' (a size is never shown negative)."""
    return _NEGATIVE.sub(lambda m: f"{m.group(1)} less {m.group(2)}", text)

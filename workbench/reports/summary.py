"""`summary(recording)`: the one table a person (or the CLI) reads first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .anatomy import breakdown_lines, breakdown_missing
from .capture import by_reason, static_verdicts
from .churn import capture_churn, churn_lines
from .coverage import decode_coverage, seam_costs
from .hazards import alias_hazards
from .latency import LATENCY_DEFINITION, decode_latency, peer_latency
from .peer_profile import peer_lines
from .plan import elided_mechanisms
from .rewrites import rewrites_line
from .source import MEMORY_NOT_RECORDED, NOT_RECORDED, Frames, as_frames
from .steps import tokens_frame
from .units import fmt_bytes, fmt_count, fmt_ms, fmt_rate, fmt_us

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["summary", "summary_text"]


def summary(src: Recording | Frames) -> pd.DataFrame:
    """One row per fact: section, metric, value (a number, or None), text (with units).

    Sections: plan (nodes, host fallback, static capture verdicts), decode (steps,
    tokens, prefill ms, decode latency = decode wall time per generated token, tokens/s, median decode step,
    onnxruntime's latency and the ratio where the recording carries one), time (each phase's
    step breakdown: kernels, seams, replay, capture, shapes, executor; onnxruntime's
    profile beside ours where recorded), memo (actions, views reused,
    dispatch elided), views (zero-copy views, in-place writes, copies), memory
    (resident peak, planner peak, lower bound, one buffer per value), capture
    (segments, replays, declines by reason, capture coverage: the share of the decode's
    node time spent replaying device graphs, the costliest seam reason), soundness
    (shadow verification: "shadow checked N steps, 0 divergences"; alias hazards) -- a
    section that was not recorded says so in `text` with value None.
    """
    f = as_frames(src)
    rows: list[tuple[str, str, object, str]] = []

    def add(section: str, metric: str, value, text: str | None = None) -> None:
        rows.append((section, metric, value, text if text is not None else fmt_count(value)))

    nodes = f.get("nodes")
    add("plan", "nodes", len(nodes))
    add("plan", "host fallback nodes", int((nodes["kernel"] == "host_fallback").sum()))
    add("plan", "statically capturable nodes", int(nodes["capture_supported"].fillna(True).astype(bool).sum()))
    for r in by_reason(static_verdicts(f), "capture_reason").itertuples(index=False):
        add("plan", f"static verdict: {r.reason}", int(r.declines))
    rw = rewrites_line(f)
    add("plan", "load-time rewrites", rw[0] if rw else None,
        rw[2] if rw else "no load-time rewrites recorded (the graph was planned as loaded)")

    steps = f.get("steps")
    add("decode", "steps", len(steps))
    add("decode", "tokens generated", len(tokens_frame(f)))
    prefill = steps.loc[steps["phase"] == "prefill", "wall_ms"]
    decode = steps.loc[steps["phase"] == "decode", "wall_ms"].dropna()
    add("decode", "prefill", float(prefill.sum()) if len(prefill) else None,
        fmt_ms(prefill.sum()) if len(prefill) else "—")
    lat = decode_latency(f)
    ms = lat["ms_per_token"] if lat["decode_tokens"] else None
    add("decode", "decode latency", ms,
        "—" if ms is None else f"{ms:.3f} ms/token ({LATENCY_DEFINITION}; {lat['decode_tokens']} tokens)")
    add("decode", "decode tokens/s", lat["tokens_per_s"] if ms else None,
        fmt_rate(lat["tokens_per_s"] if ms else None))
    med = float(np.median(decode)) if len(decode) else None
    add("decode", "decode step (median)", med, fmt_ms(med) + (" (one run; the latency above is the mean per token)"
                                                             if med is not None else ""))
    peer = peer_latency(f)
    if peer is None:
        add("decode", "onnxruntime latency", None,
            "no peer measurement in this recording (workbench report and workbench demo add one)")
    else:
        same = {True: "tokens identical", False: "tokens DIFFERENT", None: "tokens not compared"}
        add("decode", f"{peer['runtime']} latency", peer["ms_per_token"],
            f"{peer['ms_per_token']:.3f} ms/token (the same loop, timed alike)")
        add("decode", f"workbench / {peer['runtime']}", peer["ratio"],
            f"{peer['ratio']:.2f}x; {same[peer['tokens_identical']]}")

    # where each step's wall time went (reports.anatomy): the parts sum to the wall time
    for line in breakdown_lines(f):
        add("time", "step breakdown", None, line)
    for line in breakdown_missing(f):
        add("time", "not split out", None, line + " (counted as executor time)")
    for line in peer_lines(f):
        add("time", "vs onnxruntime profile", None, line)

    memo = f.optional("memo_timeline")
    if memo is None:
        add("memo", "decode-plan memo", None, NOT_RECORDED)
    else:
        counts = memo["action"].value_counts()
        for action in ("primed", "rebuilt", "replayed", "ineligible", "disabled"):
            add("memo", f"memo {action}", int(counts.get(action, 0)))
        add("memo", "views reused", int(memo["views_reused"].fillna(0).sum()))
        add("memo", "dispatch elided (Stage 2)", int(memo["dispatch_elided"].fillna(0).sum()),
            f"{int(memo['dispatch_elided'].fillna(0).sum())} node executions, summed over all steps")
    # every elided node execution, by the mechanism that skipped it (the trace's mode
    # "elided" covers three: Stage 2, If skipping, shape folding; see plan.elided_by)
    mech = elided_mechanisms(f)
    if mech:
        by = pd.Series(list(mech.values()))
        for mech in ("If skip", "shape fold"):
            n = int((by == mech).sum())
            if n:
                add("memo", f"elided by {mech} (not Stage 2)", n, f"{n} node executions, summed over all steps")

    if f.memory:
        add("views", "zero-copy views created", len(f.get("views")))
        add("views", "in-place writes (dispatched, all steps)", len(f.get("aliases")),
            f"{len(f.get('aliases')):,} writes by dispatched nodes (values stored in place inside replayed "
            "graphs are not re-written; Liveness draws every value stored in place)")
        mats = f.get("materializations")
        add("views", "copies (materializations)", len(mats),
            f"{len(mats):,} ({fmt_bytes(int(mats['bytes'].sum()))})")
    else:
        add("views", "zero-copy views, in-place writes, copies", None, MEMORY_NOT_RECORDED)

    add("memory", "resident peak", int(steps["resident_peak_bytes"].max()) if len(steps) else None,
        fmt_bytes(steps["resident_peak_bytes"].max() if len(steps) else None))
    if f.memory:
        last = int(steps["step"].iloc[-1]) if len(steps) else None
        plan = f.memory_plan(last) if last is not None else None
        add("memory", "planner peak (last step)", plan.peak if plan else None,
            fmt_bytes(plan.peak if plan else None))
        add("memory", "lower bound (last step)", plan.lower_bound if plan else None,
            fmt_bytes(plan.lower_bound if plan else None))
        add("memory", "one buffer per value (last step)", plan.naive_total if plan else None,
            fmt_bytes(plan.naive_total if plan else None))
    else:
        add("memory", "planner peak, lower bound, one buffer per value", None, MEMORY_NOT_RECORDED)

    seg = f.optional("segments")
    if seg is None:
        add("capture", "capture segmentation", None, NOT_RECORDED)
    else:
        last_seg = seg[seg["step"] == seg["step"].max()] if len(seg) else seg
        add("capture", "captured segments (last step)", int((last_seg["kind"] == "captured").sum()))
        add("capture", "eager seams (last step)", int((last_seg["kind"] != "captured").sum()))
        ev = f.optional("capture_events")
        if ev is not None:
            counts = ev["event"].value_counts()
            for event in ("capture", "replay", "retire", "quarantine", "bake"):
                add("capture", f"segment {event}s", int(counts.get(event, 0)))
        dec = f.optional("capture_declines")
        if dec is not None and len(dec):
            last_dec = dec[dec["step"] == dec["step"].max()]
            for r in by_reason(last_dec).itertuples(index=False):
                add("capture", f"declines: {r.reason}", int(r.declines))
    cov = decode_coverage(f)
    share = cov["time_share"]
    add("capture", "capture coverage (decode, time-weighted)", share,
        "—" if share is None else f"{100 * share:.1f}% of node time replayed")
    if seg is not None:
        churn = capture_churn(f)
        re_recorded = churn[churn["re_records"] > 0] if not churn.empty else churn
        add("capture", "segments re-recorded", len(re_recorded),
            "none: every graph was recorded once" if re_recorded.empty else
            f"{len(re_recorded)} segments recorded again after a retire "
            f"({int(re_recorded['re_records'].sum())} re-records, "
            f"{int(churn['retires'].sum())} retires)")
        for line in churn_lines(f, limit=3):
            add("capture", "re-recorded", None, line)
        costs = seam_costs(f, by="reason")
        if not costs.empty:
            top = costs.iloc[0]
            add("capture", "costliest seam reason", float(top["us_per_token"]),
                f"{top['reason']}: {fmt_us(top['us_per_token'])} per token "
                f"({100 * float(top['share_of_step']):.1f}% of step time, {int(top['seams'])} seams; per step "
                f"p10 {fmt_us(top['p10_us'])}, median {fmt_us(top['median_us'])}, p90 {fmt_us(top['p90_us'])})")

    checks = f.optional("shadow_checks")
    if checks is None:
        add("soundness", "shadow verification", None, NOT_RECORDED)
    else:
        div = f.optional("divergences")
        n_div = 0 if div is None else len(div)
        mechs = "" if div is None or div.empty else \
            " (" + ", ".join(sorted({str(m) for m in div["mechanism"]})) + ")"
        add("soundness", "shadow verification", n_div,
            f"shadow checked {len(checks)} steps, {n_div} divergences{mechs}")
    if f.memory:
        add("soundness", "alias hazards", len(alias_hazards(f)))
    else:
        add("soundness", "alias hazards", None, MEMORY_NOT_RECORDED)
    return pd.DataFrame(rows, columns=["section", "metric", "value", "text"])


def summary_text(src: Recording | Frames) -> str:
    """`summary` as aligned plain text, one section after another (for the CLI)."""
    df = summary(src)
    width = max((len(m) for m in df["metric"]), default=10)
    lines: list[str] = []
    for section, g in df.groupby("section", sort=False):
        lines.append(f"[{section}]")
        lines.extend(f"  {m:<{width}}  {t}" for m, t in zip(g["metric"], g["text"]))
    return "\n".join(lines)

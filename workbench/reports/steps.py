"""Per-step facts: which steps a slot has, one step's header, tokens, latency."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from .source import Frames, as_frames

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["latency_frame", "slots", "step_info", "steps_of_slot", "tokens_frame"]


def slots(src: Recording | Frames) -> list[str]:
    """Slots with at least one recorded step, "primary" first."""
    steps = as_frames(src).get("steps")
    seen = list(dict.fromkeys(steps["slot"]))
    return sorted(seen, key=lambda s: (s != "primary", seen.index(s)))


def steps_of_slot(src: Recording | Frames, slot: str | None = None) -> list[int]:
    """Step numbers recorded for `slot` (every step when None), in order."""
    steps = as_frames(src).get("steps")
    if slot is not None:
        steps = steps[steps["slot"] == slot]
    return [int(s) for s in steps["step"]]


def tokens_frame(src: Recording | Frames) -> pd.DataFrame:
    """step, token, position of every generated token (empty when no Generator ran)."""
    t = as_frames(src).optional("tokens")
    if t is None:
        return pd.DataFrame({"step": pd.Series([], dtype="int64"), "token": pd.Series([], dtype="int64"),
                             "position": pd.Series([], dtype="int64")})
    return t[["step", "token", "position"]].reset_index(drop=True)


def step_info(src: Recording | Frames, step: int) -> dict[str, Any]:
    """One step's header: slot, phase, bindings, wall_ms, resident peak, token, memo action."""
    f = as_frames(src)
    steps = f.get("steps")
    row = steps[steps["step"] == step]
    if row.empty:
        return {"step": step, "recorded": False}
    r = row.iloc[0]
    info: dict[str, Any] = {
        "step": int(step), "recorded": True, "slot": r["slot"], "phase": r["phase"],
        "bindings": dict(r["bindings"]), "wall_ms": float(r["wall_ms"]),
        "resident_peak_bytes": int(r["resident_peak_bytes"]),
    }
    tokens = tokens_frame(f)
    tok = tokens[tokens["step"] == step]
    info["token"] = int(tok["token"].iloc[-1]) if not tok.empty else None
    memo = f.optional("memo_timeline")
    m = memo[memo["step"] == step] if memo is not None else None
    info["memo_action"] = m["action"].iloc[-1] if m is not None and not m.empty else None
    info["memo_reason"] = m["reason"].iloc[-1] if m is not None and not m.empty else None
    return info


def latency_frame(src: Recording | Frames) -> pd.DataFrame:
    """step, slot, phase, wall_ms, tokens_per_s (1000 / wall_ms for one-token decode steps)."""
    steps = as_frames(src).get("steps")
    out = steps[["step", "slot", "phase", "wall_ms"]].copy()
    one_token = out["phase"].eq("decode")
    out["tokens_per_s"] = (1e3 / out["wall_ms"]).where(one_token)
    return out.reset_index(drop=True)

"""The one latency definition: decode wall time per generated token, prefill excluded.

`per_token_ms` is the formula; `decode_latency(recording)` applies it to a recording's
decode steps (`summary`, the widget's Summary tab, `workbench demo` and `workbench
report` all print this number), `per_token_ms` on onnxruntime's run times measured
the same way (wall time of each decode run) gives the number printed next to it.

A recording carries that peer measurement as its generic table `peer` (one row:
runtime, ms_per_token, tokens_per_s, decode_runs, decode_tokens, tokens_identical;
`workbench report` and `workbench demo` add it); `peer_latency(recording)` reads it
back with the ratio, so the summary and the HTML report print "workbench /
onnxruntime: N x" as the CLI does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .source import Frames, as_frames
from .steps import tokens_frame

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["DECODE_PHASES", "LATENCY_DEFINITION", "PEER_TABLE", "decode_latency", "peer_latency", "per_token_ms"]

#: the generic table a peer runtime's latency is carried in
PEER_TABLE = "peer"

LATENCY_DEFINITION = "decode wall time per generated token (prefill excluded)"

#: phases whose runs generate tokens after the prompt (speculative verify yields several)
DECODE_PHASES = ("decode", "verify")


def per_token_ms(decode_run_seconds: Iterable[float], decode_tokens: int) -> float:
    """Sum of the decode runs' wall seconds / tokens they generated, in ms (nan without any)."""
    total = float(sum(decode_run_seconds))
    return 1e3 * total / decode_tokens if decode_tokens > 0 else math.nan


def decode_latency(src: Recording | Frames) -> dict:
    """`ms_per_token`, `tokens_per_s`, `decode_runs`, `decode_tokens`, `definition` of a
    recording's decode (steps whose phase is decode / verify; their recorded wall time)."""
    f = as_frames(src)
    steps = f.get("steps")
    dec = steps[steps["phase"].isin(DECODE_PHASES)]
    tokens = tokens_frame(f)
    n_tokens = int(tokens["step"].isin(set(dec["step"])).sum()) if len(tokens) else 0
    if n_tokens == 0:  # no Generator recorded tokens: one token per decode run
        n_tokens = len(dec)
    ms = per_token_ms((w / 1e3 for w in dec["wall_ms"].fillna(0)), n_tokens)
    return {"ms_per_token": ms, "tokens_per_s": 1e3 / ms if ms and not math.isnan(ms) else math.nan,
            "decode_runs": len(dec), "decode_tokens": n_tokens, "definition": LATENCY_DEFINITION}


def peer_latency(src: Recording | Frames) -> dict | None:
    """The peer measurement a recording carries (its last `peer` row) with `ratio`
    (workbench's decode ms/token / the peer's), or None when there is none."""
    f = as_frames(src)
    peer = f.optional("peer")
    if peer is None or peer.empty or "ms_per_token" not in peer:
        return None
    row = peer.iloc[-1]
    ms = float(row["ms_per_token"]) if row["ms_per_token"] is not None else math.nan
    ours = decode_latency(f)["ms_per_token"]
    ratio = ours / ms if ms and not math.isnan(ms) and not math.isnan(ours) else math.nan
    same = row.get("tokens_identical")
    return {"runtime": str(row.get("runtime") or "onnxruntime"), "ms_per_token": ms,
            "tokens_per_s": 1e3 / ms if ms and not math.isnan(ms) else math.nan, "ours_ms_per_token": ours,
            "ratio": ratio, "tokens_identical": None if same is None else bool(same)}

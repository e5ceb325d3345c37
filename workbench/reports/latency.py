"""The one latency definition: decode wall time per generated token, prefill excluded.

`per_token_ms` is the formula; `decode_latency(recording)` applies it to a recording's
decode steps (`summary`, the widget's Summary tab, `workbench demo` and `workbench
report` all print this number), `per_token_ms` on onnxruntime's run times measured
the same way (wall time of each decode run) gives the number printed next to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .source import Frames, as_frames
from .steps import tokens_frame

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["DECODE_PHASES", "LATENCY_DEFINITION", "decode_latency", "per_token_ms"]

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

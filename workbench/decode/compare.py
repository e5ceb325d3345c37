"""`compare`: does a mechanism change any token? One call, one frame.

Two sessions of the same model decode the same prompt greedily, each under its
own `SessionOptions`; per step the frame says whether the tokens agree, how far
the logits are apart, and — for a side that runs with shadow verification — the
first node whose served value differed from eager execution.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..session import InferenceSession, SessionOptions
from .generator import Generator

COLUMNS = ["step", "phase", "token_a", "token_b", "tokens_equal", "max_logits_err",
           "first_divergent_node_a", "first_divergent_node_b"]


def compare(model: Any, prompt: list[int], steps: int, a: SessionOptions | None = None,
            b: SessionOptions | None = None, backend: str = "cpu", kv: str = "auto") -> Any:
    """Decode `prompt` for `steps` new tokens under options `a` and `b`; a DataFrame
    with one row per step (0 is the prefill):

    `step, phase, token_a, token_b, tokens_equal, max_logits_err,
    first_divergent_node_a, first_divergent_node_b` — the last two name the first
    divergent node (plan order) and its mechanism when that side records shadow
    divergences (e.g. `SessionOptions(shadow="record")`), else "".

    Both sides decode independently: after a flipped token they feed different
    histories, so look at the first row where `tokens_equal` is False. `a` defaults
    to every mechanism off (plain eager), `b` to the default options.
    """
    import pandas as pd  # the frame is the product; keep the import out of `import workbench`

    a = a if a is not None else _eager()
    b = b if b is not None else SessionOptions()
    results, sessions = [], []
    for options in (a, b):
        session = InferenceSession(model, options=options, backend=backend)
        result = Generator(session).generate(list(prompt), steps, kv=kv, progress=False,
                                             eos_token_id=-1, return_logits=True)
        results.append(result)
        sessions.append(session)
    firsts = [_first_divergences(s) for s in sessions]
    rows = []
    ra, rb = results
    for step in range(min(len(ra.tokens), len(rb.tokens))):
        la, lb = ra.logits[step], rb.logits[step]
        rows.append({
            "step": step, "phase": "prefill" if step == 0 else "decode",
            "token_a": ra.tokens[step], "token_b": rb.tokens[step],
            "tokens_equal": ra.tokens[step] == rb.tokens[step],
            "max_logits_err": float(np.max(np.abs(la.astype(np.float64) - lb.astype(np.float64)))),
            "first_divergent_node_a": firsts[0].get(step, ""),
            "first_divergent_node_b": firsts[1].get(step, ""),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _eager() -> SessionOptions:
    return SessionOptions(decode_memo=False, capture=False, views=False, compute_in_place=False,
                          view_plan=False, release_dead_values=False)


def _first_divergences(session: InferenceSession) -> dict[int, str]:
    """Run index -> "node (mechanism)" of the first divergent node that run."""
    rec = session.recording
    if rec is None:
        return {}
    frame = rec.divergences()
    out: dict[int, str] = {}
    for step, group in frame.groupby("step"):
        first = group.sort_values("plan_index").iloc[0]
        out[int(step)] = f"{first.node} ({first.mechanism})"
    return out


__all__ = ["COLUMNS", "compare"]

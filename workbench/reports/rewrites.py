"""What the load-time optimizer changed: the loaded graph's nodes folded / fused / removed
before the plan was built (`Recording.rewrites`), one row per original node."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .source import Frames, as_frames
from .units import fmt_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["REWRITE_COLUMNS", "REWRITE_RULES", "load_rewrites", "rewritten_nodes", "rewrites_line"]

#: rule code -> what it did, in words
REWRITE_RULES = {
    "constant_folding": "folded into a constant (computed once at load)",
    "dead_node": "removed: its outputs feed nothing",
    "identity_op": "removed: an Identity, or a Cast to its input's own dtype; its readers read that input",
    "unread_output": "kept, without the optional outputs nothing reads (not made, no buffer)",
    "unused_initializer": "initializer dropped: nothing reads it",
    "matvec_layout": "kept, its weight stored column-major (faster one-token MatMul)",
    "matvec_threads": "kept, its weight padded with zero columns so OpenBLAS runs it on every core; "
                      "a Slice (a view) takes the real columns",
    "nbits_dequantized": "kept, as a MatMul over its 2/4/8-bit weight dequantized once at load (float32)",
    "huge_pages": "kept, its weight moved into memory backed by 2 MiB pages (streamed with fewer TLB misses)",
    "matmul_siblings": "fused: MatMuls of one input, weights concatenated into one MatMul + Split",
    "rms_norm": "fused: RMSNorm written out op by op, as one SimplifiedLayerNormalization",
    "layer_norm": "fused: LayerNorm written out op by op, as one LayerNormalization",
    "gelu": "fused: GELU (erf or tanh form) written out op by op, as one Gelu / FastGelu",
    "silu": "fused: x * Sigmoid(x) (SiLU), as one com.microsoft QuickGelu(alpha=1)",
    "attention": "fused: repeat_kv, Q K^T, scale, mask, Softmax, @ V as one ai.workbench MaskedSoftmaxAttention",
}

REWRITE_COLUMNS = ["rule", "original_nodes", "original_ops", "result", "nodes_saved", "bytes_delta", "kept"]


def load_rewrites(src: Recording | Frames) -> pd.DataFrame | None:
    """The rewrites table (columns `REWRITE_COLUMNS`), None when it was not recorded."""
    return as_frames(src).optional("rewrites")


def rewritten_nodes(src: Recording | Frames, in_plan: bool = False) -> pd.DataFrame:
    """One row per node of the *original* graph that is not in the plan because a
    load-time rewrite folded or removed it: `node, op_type, rule, what` (the rule in
    words), `result` (what stands in its place), `bytes_delta` (of the whole rewrite).
    `in_plan=True` lists instead the nodes a rewrite kept but changed (nodes_saved 0,
    e.g. matvec_layout)."""
    df = load_rewrites(src)
    rows = []
    if df is not None:
        for r in df.itertuples(index=False):
            if _kept(r) != in_plan:
                continue
            names = list(r.original_nodes) if r.original_nodes is not None else []
            ops = list(r.original_ops) if r.original_ops is not None else []
            for i, name in enumerate(names or [""]):
                rows.append((str(name), str(ops[i]) if i < len(ops) else "", r.rule,
                             REWRITE_RULES.get(r.rule, r.rule), str(r.result or "—"), int(r.bytes_delta or 0)))
    return pd.DataFrame(rows, columns=["node", "op_type", "rule", "what", "result", "bytes_delta"])


def _kept(row) -> bool:
    """Whether the rewrite left its original nodes in the plan (recordings made before
    the `kept` column existed: when it saved no node)."""
    kept = getattr(row, "kept", None)
    if kept is None or kept != kept:  # absent, or NaN in an older table
        return int(row.nodes_saved or 0) == 0
    return bool(kept)


def _rule_part(rule: str, rows: pd.DataFrame) -> str:
    saved = int(rows["nodes_saved"].fillna(0).sum())
    if all(_kept(r) for r in rows.itertuples(index=False)):
        return f"{rule}: {len(rows)} weights relaid, nodes kept"
    return f"{rule} {saved}" if saved else f"{rule}: {len(rows)} rewrites, no node saved"


def rewrites_line(src: Recording | Frames) -> tuple[int, int, str] | None:
    """(nodes saved, bytes delta, "N nodes folded / fused / removed at load, M bytes (...)")
    or None when not recorded."""
    df = load_rewrites(src)
    if df is None:
        return None
    n = int(df["nodes_saved"].fillna(0).sum()) if len(df) else 0
    b = int(df["bytes_delta"].fillna(0).sum()) if len(df) else 0
    parts = ", ".join(_rule_part(rule, g) for rule, g in df.groupby("rule", sort=False)) if len(df) else "none"
    sign = "+" if b > 0 else ("-" if b < 0 else "")
    return n, b, (f"{n} nodes folded / fused / removed at load, {sign}{fmt_bytes(abs(b))} resident "
                  f"({parts})")

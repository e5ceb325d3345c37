"""One vocabulary for every frame, and a glossary of the jargon the reports use.

Frames built in `workbench.trace.frames` predate this table and name a few things
differently (`node_timings()`, `views()` and `materializations()` call the op type
`op`; `nodes()` calls the node's name `name`). `canonical(frame)` renames those
columns to the shared vocabulary (`COLUMNS`); every frame `workbench.reports` builds
already uses it. `workbench/reports/README.md` has the same table for people.
"""

from __future__ import annotations

import pandas as pd

from ..reasons import DECLINE_REASONS

__all__ = ["ALIASES", "COLUMNS", "DECLINE_REASONS", "GLOSSARY", "canonical", "explain"]

#: column name -> what it means, in every frame of `workbench.reports`
COLUMNS: dict[str, str] = {
    "step": "index of the run (one decode step) in the Recording, 0, 1, 2, ...",
    "slot": "which captured-graph slot ran the step: primary (M=1 decode) or verify (speculative M=k+1)",
    "phase": "prefill | decode | verify (as the Generator named the run)",
    "plan_index": "the node's position in the execution plan (-1: before any node; n_nodes: after the last)",
    "node": "the node's name",
    "op_type": "the node's ONNX op type (MatMul, Reshape, GroupQueryAttention, ...)",
    "kernel": "native | host_fallback (the node runs on onnx.reference on the host)",
    "mode": "what a node did at a step: eager (dispatched) | replayed (inside a device graph) | elided (Stage 2)",
    "value": "a value's name (tensor name in the ONNX graph)",
    "value_id": "the executor's id of a value (joins with values())",
    "bytes": "bytes of storage (0 for a view or an in-place alias: they own none)",
    "duration_us": "time in microseconds (a replayed segment's time is shared evenly by its nodes)",
    "reason": "a structured reason code (capture declines: DECLINE_REASONS)",
    "detail": "the reason in words, naming the value / input it is about",
    "segment": "index of a capture segment within the step's segment plan",
    "share": "a fraction in [0, 1]; the shares of one breakdown sum to 1",
    "us_per_token": "microseconds per generated token",
    "nodes": "node executions counted (capture_coverage)",
    "time_us": "summed node time of a step, µs",
    "<kind>_nodes": "capture_coverage: executions of that kind (replayed, eager, host_fallback, elided)",
    "<kind>_us": "capture_coverage: µs spent in executions of that kind",
    "<kind>_share": "capture_coverage: share of the step's executions of that kind",
    "<kind>_time_share": "capture_coverage: share of the step's node time of that kind",
    "steps": "how many steps a row sums over",
    "tokens": "tokens the summed steps generated",
    "total_us": "µs summed over the steps",
    "share_of_step": "µs / the steps' wall time",
    "seams": "distinct seam nodes with that reason",
    "op_types": "the op types involved, comma separated",
    "peak_index": "the plan index where the step's activation bytes peak",
    "kind": "peak_values: kv (a present KV output) | activation",
    "first_def": "plan index of the value's producer (-1: an input or initializer)",
    "last_use": "plan index of the value's last reader (n_nodes: a graph output), extended over its views",
    "pinned": "the buffer has (had) a live view: never released or written in place",
    "shared_with": "the views and in-place aliases living in the same buffer (their bytes count once)",
    "category": "resident_breakdown: weights | kv_cache | activations | inputs | workspace | total | ...",
    "x_weights": "bytes / the weights' bytes (how many times the model file)",
    "note": "what a row counts, in words",
    "write": "alias_hazards: in place | replayed | bound output | eager",
    "buffer": "the value owning the buffer written into",
    "victim": "a value still live in the written buffer",
    "victim_storage": "owner | view | alias | input | initializer",
    "victim_first_def": "the victim's producer's plan index",
    "victim_last_use": "the victim's last reader's plan index (after the write: the hazard)",
    "kv": "a KV pair's short key (the names with past/present stripped), e.g. 0key",
    "io": "past (the KV input fed) | present (the KV output made)",
    "past": "a KV pair's input name",
    "present": "a KV pair's output name",
    "past_id": "the past input's value id",
    "present_id": "the present output's value id",
    "past_symbol": "the symbol on the past input's sequence axis",
    "present_symbol": "the symbol on the present output's sequence axis",
    "seq_axis": "the KV tensors' sequence axis",
    "dtype": "element type (float, int64, ...)",
    "capacity": "positions the buffer holds along the sequence axis",
    "length": "positions in use",
    "free": "capacity - length",
    "growth": "length - the previous step's length (same slot)",
    "address": "device/host address of the buffer (when the recording has io_buffers), else None",
    "moved": "the buffer is not the previous step's (None: not known from this recording)",
    "copied_bytes": "bytes copied to make the value this step (a Concat rewriting the past, materializations)",
    "how": "new buffer | same buffer | in place | bound | input",
    "delta": "diff: b - a when both are numbers",
    "aspect": "diff: which part of the recordings a row compares",
    "item": "diff: the thing compared (a node, a symbol, a reason, a metric)",
    "a": "diff: the value in the first recording / step",
    "b": "diff: the value in the second recording / step",
    "changed": "diff: whether a and b differ",
    "p10_us": "the 10th percentile over steps of a row's µs per step",
    "median_us": "the median over steps of a row's µs per step",
    "p90_us": "the 90th percentile over steps of a row's µs per step",
    "mean_us": "the mean over steps of a row's µs per step",
    "part": "step_breakdown: where wall time went -- kernels | seams | replay | capture | shapes | executor (STEP_PARTS); breakdown_spread adds wall",
    "us": "µs of one step in that part (and op type); a step's rows sum to its wall time",
    "wall_us": "the step's wall time, µs (begin to end of the run)",
    "<part>_us": "step_parts: µs of the step in that part (kernels_us, seams_us, replay_us, capture_us, shapes_us, executor_us)",
    "found_in": "join_peer_profile: where the node is -- both | workbench only (not in onnxruntime's profile: fused or folded there) | onnxruntime only (not in our plan)",
    "provider": "onnxruntime's execution provider that ran the node",
    "calls": "kernel events of the node in onnxruntime's profile",
    "runs": "model runs in onnxruntime's profile (after the skipped ones)",
    "us_per_run": "onnxruntime's kernel µs per model run",
    "run_us": "the mean profiled onnxruntime model run, µs (profiling slows it)",
    "ours_us": "workbench's node µs per decode step",
    "peer_us": "onnxruntime's kernel µs per run",
    "diff_us": "ours_us - peer_us",
    "ratio": "ours_us / peer_us",
    "ours_split": "ours_us includes a replayed segment's time split evenly over its nodes (not measured per node)",
}

#: (frame, its column) -> the vocabulary's name for it
ALIASES: dict[tuple[str, str], str] = {
    ("node_timings", "op"): "op_type",
    ("views", "op"): "op_type",
    ("materializations", "op"): "op_type",
    ("nodes", "name"): "node",
    ("views", "producer"): "node",
}

#: jargon -> a sentence (the HTML report and the widgets show these on hover)
GLOSSARY: dict[str, str] = {
    **{code: f"capture decline: {text}" for code, text in DECLINE_REASONS.items()},
    "host_read": "capture decline: the kernel reads an input's values on the host (e.g. a Reshape's shape "
                 "tensor), which a device graph cannot do while it replays",
    "growing_symbol": "capture decline: a shape references a length that grows every decode step (the KV "
                      "length), so a graph recorded at one length cannot replay at the next",
    "host_fallback": "the node has no native kernel and runs on onnx.reference on the host (slow, never captured)",
    "primary": "slot primary: the captured graphs for ordinary one-token decode steps (M=1)",
    "verify": "slot verify: the captured graphs for speculative verify runs (M=k+1 tokens at once)",
    "slot": "a set of captured graphs with its own bookkeeping: primary (M=1 decode) or verify (M=k+1)",
    "Stage 2": "the memo's cached view plan: view nodes whose views were seen identical twice are not "
               "dispatched on a matching replay; their views are reinstated (dispatch elided)",
    "elided": "mode elided: the node was not dispatched -- by Stage 2 (its view reinstated), If skip (an "
              "unchanged If) or shape fold (a Shape -> Gather -> Unsqueeze -> Concat value served from the memo)",
    "shape fold": "on a memo replay, shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat ...) whose values "
                  "cannot change is served from the reference step instead of dispatched (memo_stats "
                  "shape_folded; shadow mechanism shape_fold)",
    "shape_fold": "shadow mechanism shape_fold: shape arithmetic served from the memo on a replay (shape fold)",
    "If skip": "an If whose condition and inputs did not change is not re-run; its outputs are kept (not Stage 2)",
    "constant_folding": "load-time rewrite: a node whose inputs are all constants computed once at load and "
                        "replaced by an initializer",
    "dead_node": "load-time rewrite: a node whose outputs feed nothing, removed at load",
    "identity_op": "load-time rewrite: an Identity, or a Cast to the dtype its input already has, removed at "
                   "load; its readers read that input",
    "unread_output": "load-time rewrite: an optional output nothing reads, left out of its node at load",
    "unused_initializer": "load-time rewrite: an initializer nothing reads, dropped at load",
    "opset_import_assumed": "load-time fact: a domain the model's nodes use but do not import, read as "
                            "version 1 (as onnxruntime reads it)",
    "shape_inference_failed": "load-time fact: ONNX shape inference stopped (the message says where and why); "
                              "values past it get their dtype and shape at run time",
    "shape_inference_incomplete": "load-time fact: ONNX shape inference left some nodes' outputs untyped (an op "
                                  "it has no schema for); those values get their dtype and shape at run time",
    "value_info_dropped": "load-time fact: value_info entries that contradicted the initializer or Constant "
                          "they name (another dtype, rank or dim) were dropped before shape inference; that "
                          "tensor itself stands, as in onnxruntime",
    "replayed": "mode replayed: the node ran inside a captured device graph's replay (no dispatch)",
    "eager": "mode eager: the node was dispatched on its own, one kernel launch",
    "seam": "an eager node between captured segments; every seam has a decline reason",
    "bake": "capture bake: a value a captured node reads on the host (a shape tensor whose values the memo "
            "validated as the same at every replay) is taken into the graph as a constant when it is recorded; "
            "'segment bakes' counts these values, one per node, so one capture can bake several",
    "warm-up": "a step run eagerly before capture: its just-in-time shapes seed the recording of the "
               "captured segments at a later step",
    "primed": "memo primed: the first observation of a binding signature (nothing to reuse yet)",
    "rebuilt": "memo rebuilt: two consecutive steps diffed; symbols that changed are varying",
    "memo replayed": "memo replayed: invariant shapes reused, only the varying tail re-resolved",
    "view": "a value that shares its owner's buffer (shape, strides, byte offset): no copy",
    "alias": "an in-place write: the value was computed into a dead input's buffer",
    "pinned": "a buffer with a live view: never released or written in place for the rest of the run",
    "lower bound": "the most activation bytes live at once: no allocator can do with less",
    "planner peak": "the arena a liveness-based allocator needs for the step's activations",
    "one buffer per value": "the bytes of every activation's own buffer, never reused",
}


def explain(term: str) -> str | None:
    """The glossary sentence for `term` (a reason code, a mode, a slot...), or None."""
    return GLOSSARY.get(term)


def canonical(frame: pd.DataFrame, name: str | None = None) -> pd.DataFrame:
    """`frame` with its columns renamed to the vocabulary (`ALIASES`); `name` says which
    frame it is (`node_timings`, `views`, ...); without it every known alias applies when
    the canonical name is not already a column."""
    renames = {}
    for (fname, col), canon in ALIASES.items():
        if (name is None or fname == name) and col in frame.columns and canon not in frame.columns \
                and col != canon:
            renames[col] = canon
    return frame.rename(columns=renames)

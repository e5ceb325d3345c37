"""SessionOptions: every switch of the executor, mirrored by WORKBENCH_* variables.

They live with the executor they switch (the session layer above re-exports them).
The two settings of the load-time rewrites are checked by the layer that defines them
(`rewrite.optimize.check_level`, `rewrite.wide_layout.check_setting`): options import
them from below, as `executor` may import `rewrite`, and the rewrites never see
`SessionOptions` (the session hands `optimize` the two values).

An environment variable gives an option's default (`0`, `false`, `off`, `no`
disable; anything else enables); a value passed explicitly always wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..rewrite.optimize import check_level
from ..rewrite.wide_layout import DEFAULT_WIDE_WEIGHT_LAYOUT, check_setting

_FALSE = {"0", "false", "off", "no", ""}


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() not in _FALSE


def _flag(name: str, default: bool):
    return field(default_factory=lambda: env_flag(name, default))


@dataclass
class SessionOptions:
    """Options for an InferenceSession."""

    #: record what the executor does into `session.recording` (WORKBENCH_TRACE)
    trace: bool = _flag("WORKBENCH_TRACE", True)
    #: with `trace`, record the memory tables too: liveness, io_buffers, views, buffer
    #: events, in-place aliases and materializations (WORKBENCH_TRACE_MEMORY). Off, a
    #: recording keeps the steps, node timings, the memo and the capture tables, at
    #: about half the trace's cost on small decoders (benchmarks/trace_overhead.py)
    trace_memory: bool = _flag("WORKBENCH_TRACE_MEMORY", True)
    #: layout ops (Reshape, Transpose, Slice, ...) produce zero-copy views (WORKBENCH_VIEWS)
    views: bool = _flag("WORKBENCH_VIEWS", True)
    #: elementwise kernels may write into a dead input's buffer (WORKBENCH_COMPUTE_IN_PLACE)
    compute_in_place: bool = _flag("WORKBENCH_COMPUTE_IN_PLACE", True)
    #: free a buffer after its last reader; off by default because device-graph
    #: capture needs stable addresses (WORKBENCH_RELEASE_DEAD_VALUES)
    release_dead_values: bool = _flag("WORKBENCH_RELEASE_DEAD_VALUES", False)
    #: decode-plan memo: replay invariant shapes and cached views across decode steps
    #: (WORKBENCH_DECODE_MEMO)
    decode_memo: bool = _flag("WORKBENCH_DECODE_MEMO", True)
    #: re-resolve every replayed step in full and raise on any difference
    #: (WORKBENCH_DECODE_MEMO_VERIFY; the test suite turns it on)
    decode_memo_verify: bool = _flag("WORKBENCH_DECODE_MEMO_VERIFY", False)
    #: record steady decode steps into device graphs and replay them; needs a backend
    #: that can capture (both can) and stable buffers (WORKBENCH_CAPTURE)
    capture: bool = _flag("WORKBENCH_CAPTURE", True)
    #: captured segments shorter than this many compute nodes stay eager
    min_segment_nodes: int = 2
    #: a segment retired this many times for the same reason is captured no more in
    #: its slot: its nodes become seams with the decline `rerecord_limit`, which names
    #: the reason and the count (WORKBENCH_CAPTURE_RERECORD_LIMIT; 0: no limit)
    capture_rerecord_limit: int = field(
        default_factory=lambda: int(os.environ.get("WORKBENCH_CAPTURE_RERECORD_LIMIT", "3") or 3))
    #: load-time graph rewrites, as onnxruntime's levels: "disabled", "basic",
    #: "extended", "all" (WORKBENCH_GRAPH_OPTIMIZATION); see `rewrite.optimize`
    graph_optimization_level: str = field(
        default_factory=lambda: os.environ.get("WORKBENCH_GRAPH_OPTIMIZATION", "all"))
    #: the memory order level "all" gives a wide MatMul weight on a multithreaded
    #: OpenBLAS: "column-major", as every other, or "row-major", which some machines
    #: read faster (WORKBENCH_WIDE_WEIGHT_LAYOUT); see `rewrite.wide_layout`
    wide_weight_layout: str = field(
        default_factory=lambda: os.environ.get("WORKBENCH_WIDE_WEIGHT_LAYOUT", DEFAULT_WIDE_WEIGHT_LAYOUT))
    #: Stage 2 of the memo, the cached view plan: a replay reinstates validated views
    #: instead of dispatching their layout nodes (WORKBENCH_VIEW_PLAN; needs decode_memo
    #: and views)
    view_plan: bool = _flag("WORKBENCH_VIEW_PLAN", True)
    #: shadow verification: re-run every step a mechanism served (memo replay, Stage 2,
    #: captured replay, If skipping) eagerly on private buffers and compare every output.
    #: "off", "record" (divergences go to `recording.divergences()`) or "raise"
    #: (`MechanismDivergenceError` at the first one) (WORKBENCH_SHADOW)
    shadow: str = field(default_factory=lambda: _shadow_mode(os.environ.get("WORKBENCH_SHADOW")))
    #: the fraction of served steps shadowed, 0..1 (WORKBENCH_SHADOW_FRACTION)
    shadow_fraction: float = field(
        default_factory=lambda: float(os.environ.get("WORKBENCH_SHADOW_FRACTION", "1") or 1))
    #: float32 on the host rounded as onnxruntime's CPU kernels round it, bit for bit
    #: (Sigmoid, QuickGelu, the RMS norms): "auto" where the model quantizes activations
    #: at run time (MatMulNBits at accuracy_level 4, DynamicQuantizeLinear, ...), whose
    #: integers one ulp upstream can change, and elsewhere where onnxruntime's rounding is
    #: also the faster form (a compiled kernel: GroupQueryAttention's one-token decode);
    #: "always"; or "never" (numpy's arithmetic, within a few ulps)
    #: (WORKBENCH_ONNXRUNTIME_ROUNDING)
    onnxruntime_rounding: str = field(
        default_factory=lambda: os.environ.get("WORKBENCH_ONNXRUNTIME_ROUNDING", "auto"))

    def __post_init__(self) -> None:
        self.shadow = _shadow_mode(self.shadow)
        self.graph_optimization_level = check_level(self.graph_optimization_level)
        self.wide_weight_layout = check_setting(self.wide_weight_layout)
        if int(self.capture_rerecord_limit) < 0:
            raise ValueError(f"capture_rerecord_limit must be >= 0, got {self.capture_rerecord_limit!r}")
        if not 0.0 <= float(self.shadow_fraction) <= 1.0:
            raise ValueError(f"shadow_fraction must be within 0..1, got {self.shadow_fraction!r}")
        self.onnxruntime_rounding = str(self.onnxruntime_rounding).strip().lower()
        if self.onnxruntime_rounding not in ROUNDING_MODES:
            raise ValueError(f"onnxruntime_rounding must be one of {ROUNDING_MODES}, "
                             f"got {self.onnxruntime_rounding!r}")


SHADOW_MODES = ("off", "record", "raise")
ROUNDING_MODES = ("auto", "always", "never")


def _shadow_mode(raw: str | bool | None) -> str:
    """Normalise a shadow setting: off / record / raise (1, on, true mean record)."""
    if raw is None or raw is False:
        return "off"
    if raw is True:
        return "record"
    text = str(raw).strip().lower()
    if text in _FALSE:
        return "off"
    if text in ("1", "on", "true", "yes"):
        return "record"
    if text not in SHADOW_MODES:
        raise ValueError(f"shadow must be one of {SHADOW_MODES}, got {raw!r}")
    return text

"""Shadow verification: a served step re-executed eagerly, every value compared.

A mechanism (memo replay, the cached view plan, a captured replay, If skipping,
views and in-place writes) may change when and how work happens, never a value.
Shadow checks that claim where it can disagree: on a step a mechanism served, the
same feeds (copied before the step, since a bound output may alias a feed) run
through a second executor with every mechanism off and private buffers, and every
value the step left intact is compared with the reference's.

Only the executor calls this module; it returns `Divergence` rows and never raises
by itself (the executor decides, per `SessionOptions.shadow`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .storage import ALIAS, OWNER, VIEW, StoragePlan

#: fp32 noise allowed between two evaluation orders of the same math (a strided
#: view read in place vs a contiguous copy may take another BLAS path)
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Divergence:
    plan_index: int
    node: str
    op_type: str
    value: str
    mechanism: str
    max_abs_err: float
    shape_expected: tuple | None
    shape_got: tuple | None


class Shadow:
    """Decides which steps to shadow, keeps the reference executor, compares."""

    def __init__(self, mode: str, fraction: float):
        self.mode = mode
        self.fraction = fraction
        self.served = 0  # served steps seen so far (for the fraction)
        self.checked = 0
        self._reference: Any = None

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def due(self) -> bool:
        """Whether the next served step is shadowed: an even spread of `fraction`."""
        self.served += 1
        return math.floor(self.served * self.fraction) != math.floor((self.served - 1) * self.fraction)

    def reference(self, make_executor: Any, options: Any) -> Any:
        """The eager executor: same graph and backend, every mechanism off."""
        if self._reference is None:
            eager = replace(options, trace=False, views=False, compute_in_place=False,
                            release_dead_values=False, decode_memo=False, decode_memo_verify=False,
                            capture=False, view_plan=False, shadow="off")
            self._reference = make_executor(eager)
            self._reference.skip_unchanged_if = False
        return self._reference

    def compare(self, executor: Any, arrays: list, reference_arrays: list, mechanisms: dict[int, str],
                default_mechanism: str) -> list[Divergence]:
        """Every intact node output of the served step against the reference's."""
        self.checked += 1
        values = executor.graph.values
        intact = intact_values(executor.plan, executor.state.storage)
        found = []
        for p in executor.plan.nodes:
            for vid in p.outputs:
                if vid < 0 or vid not in intact:
                    continue
                got, want = arrays[vid], reference_arrays[vid]
                if got is None or want is None or not hasattr(want, "shape"):
                    continue
                err = difference(executor.backend, got, want)
                if err is not None:
                    found.append(Divergence(
                        p.index, p.node.name, p.node.op_type, values[vid].name,
                        mechanisms.get(p.index, default_mechanism), err,
                        tuple(want.shape), tuple(getattr(got, "shape", ()))))
        return found


def intact_values(plan: Any, storage: StoragePlan) -> set[int]:
    """Node outputs whose bytes still hold their own value at the end of the step:
    views (their owner is pinned from the view on) and, per owner, the last value
    written into it (an in-place write overwrites the dead input it reuses)."""
    last_writer: dict[int, int] = {}
    for p in plan.nodes:
        for vid in p.outputs:
            if vid >= 0 and storage.storage.get(vid) in (OWNER, ALIAS):
                last_writer[storage.owner.get(vid, vid)] = vid
    intact = set(last_writer.values())
    intact.update(v for v, kind in storage.storage.items() if kind == VIEW)
    return intact


def difference(backend: Any, got: Any, want: Any) -> float | None:
    """None when `got` matches `want` (fp tolerance for floats, exact otherwise);
    else the max absolute error (inf for a shape or dtype mismatch)."""
    if getattr(got, "shape", None) != want.shape:
        return math.inf
    a, b = backend.to_host(got), backend.to_host(want)
    if a.dtype != b.dtype:
        return math.inf
    if a.size == 0:
        return None
    if a.dtype.kind in "fc":
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        # NaN where NaN, and the same infinity (a mask's -inf fill): equal, not inf - inf
        same = (np.isnan(a64) & np.isnan(b64)) | (np.isinf(a64) & (a64 == b64))
        with np.errstate(invalid="ignore"):
            err = np.where(same, 0.0, np.abs(a64 - b64))
        # relative to a finite reference only: against an infinity every error was within "tolerance"
        bad = ~(err <= ATOL + RTOL * np.abs(np.where(np.isfinite(b64), b64, 0.0)))
        return float(np.nanmax(np.where(np.isnan(err), math.inf, err))) if bad.any() else None
    if a.dtype.hasobject:
        return None if np.array_equal(a, b) else math.inf
    if np.array_equal(a, b):
        return None
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))

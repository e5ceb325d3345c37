"""Preparing a step: the full resolve, or a decode-plan memo replay (Stage 1), and the
cached view plan (Stage 2) and shape fold that serve the nodes of a replayed step.

`StepPreparer.prepare` takes a slot's `SlotState`, the step's feeds, symbol bindings
and bound outputs, readies the slot's dispatch list for them and returns what it did
as a `PreparedStep`: the memo's action and reason, and whether the prepared plan held
as it was (`steady`). The decisions themselves (the memo's guard, what the view plan
admits, which shape arithmetic folds) are pure functions in `memo.py`; the storage
layout is `storage.py`'s. Everything a slot keeps from step to step is on its
`SlotState`; the preparer keeps only what is fixed for the executor's life.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..addresses import holds_now
from ..errors import MemoVerifyError
from ..ir.graph import Graph
from ..ops.registry import baked_copy
from .memo import (
    STAGE2_MISMATCH_LIMIT,
    DecodePlanMemo,
    MemoStats,
    ShapeFold,
    ViewPlan,
    group_by_shape,
    growth_transition,
    shape_fold_nodes,
    shape_mentions,
    signature_diff,
    view_plan_admission,
    why_not_growth,
)
from .options import SessionOptions
from .plan import Plan, PlanNode
from .shapes import resolve, symbols_in
from .slot_state import SlotState
from .storage import VIEW, overwritten_in_place, plan_storage
from .views import address, is_view_of


@dataclass
class Dispatch:
    """What one plan node needs at run time, prepared per binding signature."""

    p: PlanNode
    outs: list  # preallocated output arrays (None: resolved just in time)
    lazy: tuple  # (position, buffer owner, value, dtype) fetched each run (release mode)
    dynamic: tuple  # (position, value id) resolved from just-in-time symbols
    view: bool  # may return a zero-copy view of input 0
    release: tuple  # owner ids whose storage dies after this node
    contiguous: tuple  # input positions the kernel needs C-contiguous
    skippable: bool  # an If that may be skipped (`PlanNode.skippable_if`)
    alias: tuple | None  # (output id, input id) the node writes in place of, for the trace
    #: (kernel, its inputs from the values, output arrays, output ids, `alias`) where the
    #: node needs nothing but the kernel call (`plain_call`); None: the full dispatch
    plain: tuple | None = None


def plain_call(d: Dispatch) -> tuple | None:
    """What the node loop needs to run `d` as a bare kernel call (and its in-place row,
    if it writes over an input), where nothing else is ever done for it: no If to skip,
    no buffer fetched or released, no view to take, no input to make contiguous, every
    input given. Prepared once per binding signature; the output arrays are `d.outs`,
    which a memo replay refills in place."""
    p = d.p
    if (d.skippable or d.lazy or d.dynamic or d.view or d.release or d.contiguous
            or not p.inputs or min(p.inputs) < 0 or not p.outputs or min(p.outputs) < 0):
        return None
    if len(p.inputs) == 1:
        only = p.inputs[0]

        def inputs_of(values: list, only: int = only) -> tuple:
            return (values[only],)
    else:
        inputs_of = operator.itemgetter(*p.inputs)  # one C call: a tuple of the inputs
    return (p.fn, inputs_of, d.outs, p.outputs, d.alias)


def in_place_pair(p: PlanNode, position_and_input: tuple[int, int] | None) -> tuple[int, int] | None:
    """(output id, input id) of a node the storage plan has write in place of an input."""
    if position_and_input is None:
        return None
    position, pos = position_and_input
    return p.outputs[position], p.inputs[pos]


def bound_signature(bound: dict[int, Any]) -> tuple:
    """Identity of the caller's output buffers: value, address, shape, strides, dtype."""
    return tuple((vid, address(arr), arr.shape, arr.strides, arr.dtype.str) for vid, arr in bound.items())


def describe_bindings(values: list, feeds: dict[int, Any], bound: dict[int, Any]) -> tuple:
    """Caller-bound I/O, length-abstracted: value, role, dtype, declared symbolic shape."""
    sig = [(values[v].name, "input", str(getattr(a, "dtype", "")), values[v].shape) for v, a in feeds.items()]
    sig += [(values[v].name, "output", str(a.dtype), values[v].shape) for v, a in bound.items()]
    return tuple(sorted(sig, key=lambda r: (r[0], r[1])))


@dataclass(frozen=True)
class PreparedStep:
    """What preparing a step did."""

    #: the memo's action: "replayed" | "rebuilt" | "primed" | "disabled"
    action: str
    reason: str
    #: the prepared plan held as it was (the same bindings and buffers as the last step,
    #: or a memo replay): what capture needs before it records or replays
    steady: bool


class StepPreparer:
    """Prepares the steps of one executor's slots (see the module docstring).

    `buffer(owner, shape, dtype, plan index, events=None)` is the executor's allocator
    for the current slot; `kernel_allocated` and `untrusted` are the executor's own sets
    (nodes whose kernel allocates its outputs; inferred symbols that proved
    inconsistent), read at each full preparation.
    """

    def __init__(self, graph: Graph, plan: Plan, options: SessionOptions, backend: Any, arrays: list,
                 stats: MemoStats, buffer: Callable[..., Any], *, fresh_arrays: bool,
                 skippable_outputs: set[int], kernel_allocated: set[int], untrusted: set[str]) -> None:
        self.graph, self.plan, self.options, self.backend, self.arrays = graph, plan, options, backend, arrays
        self.stats, self.buffer = stats, buffer
        self.fresh_arrays = fresh_arrays
        self.skippable_outputs, self.kernel_allocated, self.untrusted = skippable_outputs, kernel_allocated, untrusted
        #: plan index of a view node -> (its source input, its runtime parameter inputs)
        self._view_params: dict[int, tuple[int, tuple[int, ...]]] = {}

    # -- the full preparation ------------------------------------------------------------

    def full(self, state: SlotState, bindings: dict[str, int], bound: dict[int, Any]) -> None:
        """Resolve every shape, lay out storage and preallocate outputs."""
        values = self.graph.values
        opts = self.options
        fresh = self.fresh_arrays
        state.shapes = shapes = {v.id: resolve(v.shape, bindings) for v in values
                                 if v.dtype is not None and not fresh}
        for vid, arr in bound.items():
            shapes[vid] = tuple(arr.shape)
        release = opts.release_dead_values and not fresh
        state.storage = sp = plan_storage(
            self.plan, views=opts.views, compute_in_place=opts.compute_in_place and not fresh,
            release=release, shapes=shapes,
            protected=set(self.graph.outputs) | set(bound) | self.skippable_outputs,
        )
        state.dispatch = []
        state.preallocated = []
        state.bound_positions = {}
        state.handover = {}  # until a memo knows which outputs every replay re-sizes
        for p in self.plan.nodes:
            outs: list = []
            lazy, dynamic = [], []
            view = opts.views and p.spec.produces_view
            for j, vid in enumerate(p.outputs):
                outs.append(None)
                if vid < 0:
                    continue
                if vid in bound:
                    outs[j] = bound[vid]
                    state.bound_positions[vid] = (p.index, j)
                    continue
                v = values[vid]
                if (fresh or v.dtype is None or v.shape is None or view or sp.storage.get(vid) == VIEW
                        or p.spec.kind == "host_fallback" or p.index in self.kernel_allocated):
                    continue
                owner = sp.owner.get(vid, vid)  # an in-place alias writes into its owner's buffer
                if shapes.get(vid) is None:
                    if not any(isinstance(d, str) and not self.untrusted.isdisjoint(symbols_in(d))
                               for d in v.shape):
                        dynamic.append((j, vid))
                elif release:
                    lazy.append((j, owner, vid, v.dtype))
                else:
                    outs[j] = self.buffer(owner, shapes[vid], v.dtype, p.index)
                    state.preallocated.append((p.index, j, vid, owner))
            d = Dispatch(
                p=p, outs=outs, lazy=tuple(lazy), dynamic=tuple(dynamic), view=view,
                release=tuple(sp.release_after.get(p.index, ())),
                contiguous=p.spec.contiguous_inputs,
                skippable=p.skippable_if,
                alias=in_place_pair(p, sp.in_place.get(p.index)),
            )
            d.plain = plain_call(d)
            state.dispatch.append(d)

    # -- a step: full preparation or a memo replay ---------------------------------------

    def prepare(self, state: SlotState, feeds: dict[int, Any], bindings: dict[str, int],
                bound: dict[int, Any], rec: Any) -> PreparedStep:
        """Ready `state` for this step; what was done, and why."""
        exact = (tuple(bindings.items()), bound_signature(bound))
        replan, state.replan = state.replan, None
        if replan is not None:
            # the last run found the prepared plan wrong (a kernel needed just-in-time
            # allocation, or an inferred symbol proved inconsistent): nothing prepared,
            # memoised or cached is trusted; start observing afresh
            state.memo, state.view_plan = None, None
            state.prev_bindings, state.prev_signature = dict(bindings), self.io_signature(state, feeds, bound)
            self.full(state, bindings, bound)
            state.signature = exact
            if not self.options.decode_memo:
                return PreparedStep("disabled", "decode memo off", False)
            return PreparedStep("primed", f"re-plan requested: {replan}", False)
        steady = exact == state.signature
        if not self.options.decode_memo:
            if not steady:
                self.full(state, bindings, bound)
                state.signature = exact
            state.view_plan = None
            return PreparedStep("disabled", "decode memo off", steady)
        signature = self.io_signature(state, feeds, bound)
        memo = state.memo
        why = memo.mismatch(bindings, signature) if memo is not None else None
        if memo is not None and why is None:
            stage2 = self.stage2_guard(state)
            if stage2 is None:
                self.replay_shapes(state, memo, bindings, bound, rec)
                state.signature = exact
                state.prev_bindings, state.prev_signature = dict(bindings), signature
                return PreparedStep("replayed", "bindings match the memo", True)
            why = stage2
        prev, prev_sig = state.prev_bindings, state.prev_signature
        state.prev_bindings, state.prev_signature = dict(bindings), signature
        state.view_plan = None  # invalidated on every non-replay step
        # the same bindings and buffers as the last step, with no memo to disagree:
        # the prepared plan holds as it is (steady, e.g. a repeated fixed-shape run)
        steady = exact == state.signature and memo is None
        if not steady:
            self.full(state, bindings, bound)
            state.signature = exact
        if prev is not None and prev_sig == signature and growth_transition(prev, bindings):
            self.build_memo(state, prev, bindings, signature)
            return PreparedStep("rebuilt", why or "growth transition", steady)
        state.memo = None
        if prev is None:
            return PreparedStep("primed", "first observation", steady)
        if prev_sig != signature:
            return PreparedStep("primed", "binding signature changed: " + signature_diff(prev_sig, signature),
                                steady)
        return PreparedStep("primed", why or why_not_growth(prev, bindings), steady)

    def replay_shapes(self, state: SlotState, memo: DecodePlanMemo, bindings: dict[str, int],
                      bound: dict[int, Any], rec: Any) -> None:
        """Stage 1 replay: keep the invariant partition, re-substitute only the variant tail."""
        values, shapes, dispatch = self.graph.values, state.shapes, state.dispatch
        for shape, vids in memo.variant_groups:
            got = None if shape is None else resolve(shape, bindings)
            for vid in vids:
                shapes[vid] = got
        for vid, arr in bound.items():
            shapes[vid] = tuple(arr.shape)
            k, j = state.bound_positions[vid]
            dispatch[k].outs[j] = arr
        # a growing decode's dozens of buffer events, as one block (none without memory tables)
        events = [] if rec is not None and rec.memory else None
        for k, j, vid, owner in state.variant_preallocated:
            dispatch[k].outs[j] = self.buffer(owner, shapes[vid], values[vid].dtype, k, events)
        if events:
            rec.buffer_rows(tuple(events))

    def io_signature(self, state: SlotState, feeds: dict[int, Any], bound: dict[int, Any]) -> tuple:
        """`describe_bindings` of this step's I/O, kept per (value, dtype) set."""
        key = (tuple((v, getattr(a, "dtype", None)) for v, a in feeds.items()),
               tuple((v, a.dtype) for v, a in bound.items()))
        cached = state.signature_cache.get(key)
        if cached is None:
            cached = state.signature_cache[key] = describe_bindings(self.graph.values, feeds, bound)
        return cached

    def build_memo(self, state: SlotState, prev: dict[str, int], bindings: dict[str, int],
                   signature: tuple) -> None:
        """The memo of a growth transition: the symbols that moved, and the values whose
        shapes mention them (the variant tail every replay resolves again)."""
        values = self.graph.values
        varying = frozenset(s for s, v in bindings.items() if prev[s] != v)
        invariant, variant = {}, []
        for vid, shape in state.shapes.items():
            if shape_mentions(values[vid].shape, varying):
                variant.append(vid)
            else:
                invariant[vid] = shape
        state.memo = DecodePlanMemo(dict(bindings), varying, invariant, variant, signature,
                                    group_by_shape(variant, values))
        variant_set = set(variant)
        state.variant_preallocated = [s for s in state.preallocated if s[2] in variant_set or s[3] in variant_set]
        outputs = set(self.graph.outputs)
        state.handover = {vid: (k, j) for k, j, vid, owner in state.variant_preallocated
                          if vid == owner and vid in outputs}

    # -- after the step -------------------------------------------------------------------

    def after_run(self, state: SlotState, action: str, step: Any) -> str | None:
        """What the run just made tells the view plan and the shape fold (`step`: its
        `StepRun`). Returns why a shape fold was dropped at its check, if it was (for
        the step's memo row: a fold that never serves must say so)."""
        self._view_plan_after_run(state, action, step)
        dropped = self._shape_fold_after_run(state, action)
        self.stats.shape_folded += len(step.folded)
        return dropped

    def verify_shapes(self, state: SlotState, arrays: list) -> None:
        """Verify mode: every shape the replay served must be the shape the kernels
        actually produced this step (an independent witness, unlike a second resolve)."""
        values = self.graph.values
        for p in self.plan.nodes:
            for vid in p.outputs:
                served = state.shapes.get(vid) if vid >= 0 else None
                got = getattr(arrays[vid], "shape", None) if served is not None else None
                if got is not None and tuple(got) != served:
                    raise MemoVerifyError(
                        f"decode-plan memo replayed shape {served} for value {values[vid].name!r} "
                        f"but {p.node.label} produced {tuple(got)}")
        self.stats.verified += 1

    # -- Stage 2: the cached view plan ---------------------------------------------------

    def stage2_guard(self, state: SlotState) -> str | None:
        """None when the validated view plan's source buffers are where they were."""
        plan = state.view_plan
        if plan is None or not plan.validated:
            return None
        buffers, arrays = state.buffers, self.arrays
        held = plan.held_sources
        if held is not None:
            try:
                if held[0](buffers) and held[1](arrays):
                    state.stage2_streak = 0
                    return None
            except KeyError:  # a source buffer was dropped: look at each
                pass
        for owner, (addr, cap) in plan.sources.items():
            buf = buffers.get(owner, arrays[owner] if owner in self.graph.initializers else None)
            if buf is None or address(buf) != addr or buf.nbytes != cap:
                state.stage2_streak += 1
                self.stats.stage2_mismatches += 1
                if state.stage2_streak >= STAGE2_MISMATCH_LIMIT:
                    state.stage2_latched = self.stats.stage2_latched = True
                name = self.graph.values[owner].name
                return f"view plan source {name!r} moved or resized"
        state.stage2_streak = 0
        # the very arrays just found in place (held, they cannot move or resize): the
        # slot's buffers, and the executor's arrays of initializer sources
        owned = [owner for owner in plan.sources if owner in buffers]
        constant = [owner for owner in plan.sources if owner not in buffers]
        plan.held_sources = (holds_now(buffers, owned), holds_now(arrays, constant))
        return None

    def view_plan_state(self, state: SlotState) -> str:
        """The slot's view plan: "latched" (off for good), its own state, or "none"."""
        if state.stage2_latched:
            return "latched"
        return state.view_plan.state if state.view_plan is not None else "none"

    def reinstate_views(self, p: PlanNode, plan: ViewPlan, step: Any) -> bool:
        """Stage 2: the node's views are as they were; put them back without dispatching.
        False (nothing reinstated) when a runtime parameter of the node changed."""
        arrays, rec, pinned, state = step.arrays, step.rec, step.pinned, step.state
        same = plan.same_source.get(p.index)
        if same is None or not same(arrays):
            if self.param_keys(state, p.index) != plan.params[p.index]:
                step.view_plan_stale = True
                return False
            self._note_same_source(state, plan, p.index, arrays)
        verify = self.options.decode_memo_verify
        if verify:
            fresh = p.fn([arrays[i] if i >= 0 else None for i in p.inputs], [None] * len(p.outputs))
        views = plan.views
        for j, vid in enumerate(p.outputs):
            if vid < 0:
                continue
            view, owner, shape, strides, offset = views[vid]
            if verify and not (
                    is_view_of(fresh[j], view) and address(fresh[j]) == address(view)
                    and fresh[j].shape == view.shape and fresh[j].strides == view.strides):
                raise MemoVerifyError(f"cached view plan reinstated a stale view for {p.node.label}")
            arrays[vid] = view
            step.set_owner(vid, owner)
            step.observed[vid] = views[vid]  # a segment recorded now replays this view too
            if owner not in pinned:
                pinned.add(owner)
                if rec is not None:
                    rec.buffer("pin", owner, 0, p.index)
            if rec is not None:
                rec.view(vid, owner, shape, strides, offset, p.index)
        if rec is not None:
            rec.node(p.index, "elided", 0.0)
        return True

    def _view_plan_after_run(self, state: SlotState, action: str, step: Any) -> None:
        """Build candidates after a rebuild; validate them on the next replay (`step`:
        the run's `StepRun`, with the views it made)."""
        observed = step.observed
        if state.stage2_latched or not (self.options.views and self.options.view_plan):
            state.view_plan = None
            return
        if action == "rebuilt":
            state.view_plan = self._candidate_view_plan(state, observed)
        elif action == "replayed" and state.view_plan is not None and step.view_plan_stale:
            state.view_plan = None  # a runtime view parameter changed: re-derive from scratch
            state.stage2_streak += 1
            self.stats.stage2_mismatches += 1
        elif action == "replayed" and state.view_plan is not None and not state.view_plan.validated:
            plan = state.view_plan
            same = all(vid in observed and observed[vid][1:] == geo[1:] for vid, geo in plan.views.items())
            same = same and all(self.param_keys(state, k) == keys for k, keys in plan.params.items())
            if same:
                plan.views = {vid: observed[vid] for vid in plan.views}
                plan.validated = True
                plan.same_source = {}
                for k in plan.params:
                    self._note_same_source(state, plan, k, self.arrays)
            else:
                state.view_plan = None

    def _candidate_view_plan(self, state: SlotState, observed: dict[int, tuple]) -> ViewPlan | None:
        """The view nodes `view_plan_admission` admits, with what the guard needs."""
        invariant = state.memo.invariant
        initializers = self.graph.initializers
        buffers = state.buffers

        def stable_owner(owner: int) -> bool:
            return (owner in buffers and owner in invariant) or owner in initializers

        nodes, views, sources, params = set(), {}, {}, {}
        for p in self.plan.nodes:
            if not (p.spec.produces_view and self.options.views):
                continue
            if view_plan_admission(p, invariant, observed, stable_owner, initializers) is not None:
                continue
            params[p.index] = self.param_keys(state, p.index)
            nodes.add(p.index)
            for v in p.outputs:
                if v >= 0:
                    views[v] = observed[v]
                    owner = observed[v][1]
                    buf = buffers.get(owner, self.arrays[owner])
                    sources[owner] = (address(buf), buf.nbytes)
        return ViewPlan(frozenset(nodes), views, sources, params) if nodes else None

    def param_keys(self, state: SlotState, k: int) -> tuple:
        """What node k's views are a function of, besides constants: the geometry of
        its source (a view produced this step may sit elsewhere, e.g. after a Slice
        whose start moved) and the values of its runtime parameter inputs (every
        input after the source that is not an initializer)."""
        arrays = self.arrays
        params = self._view_params.get(k)
        if params is None:  # the plan's inputs of node k: fixed for the executor's life
            inputs = self.plan.nodes[k].inputs
            params = self._view_params[k] = (inputs[0], tuple(
                vid for vid in inputs[1:] if vid >= 0 and vid not in self.graph.initializers))
        first, runtime = params
        source = arrays[first]
        keys = [(first, None) if source is None else
                (first, address(source), source.shape, source.strides)]
        on_host = self.backend.buffers_are_host
        fold = state.shape_fold
        for vid in runtime:
            value = arrays[vid]
            if value is None:
                keys.append((vid, None))
                continue
            if fold is not None and value is fold.values.get(vid):
                host = fold.host[vid]  # the fold's private copy: its host twin (no device read, as while recording)
            elif not on_host and (baked := baked_copy(value)) is not None:
                host = baked  # shape arithmetic the recording under way bakes: its host copy
            else:
                host = value if on_host else self.backend.to_host(value)  # part of the guard, not a kernel's read
            keys.append((vid, host.shape, host.dtype.str, host.tobytes()))
        return tuple(keys)

    def _note_same_source(self, state: SlotState, plan: ViewPlan, k: int, arrays: list) -> None:
        """Keep node k's source and runtime parameters by identity (`ViewPlan.same_source`)
        when every parameter is a validated shape-fold value (or there is none)."""
        first, runtime = self._view_params[k]
        if arrays[first] is None:
            return
        fold = state.shape_fold
        if runtime and (fold is None or not fold.validated
                        or any(arrays[v] is None or arrays[v] is not fold.values.get(v) for v in runtime)):
            return
        plan.same_source[k] = holds_now(arrays, (first,) + runtime)

    # -- the shape fold ------------------------------------------------------------------

    def _shape_fold_after_run(self, state: SlotState, action: str) -> str | None:
        """After a rebuild, keep the shape arithmetic `shape_fold_nodes` finds (private
        copies of its values); on the next replay, compare it with what the kernels
        computed, and trust it only if every value matched; returns why it was dropped
        there, naming the first value that differed."""
        arrays = self.arrays
        if action == "rebuilt" and self.options.graph_optimization_level in ("extended", "all"):
            memo = state.memo
            nodes = shape_fold_nodes(self.plan, state.shapes, memo.invariant, self.graph.initializers,
                                     values=self.graph.values, varying=memo.varying,
                                     overwritten=overwritten_in_place(state.storage))
            outputs = [o for k in nodes for o in self.plan.nodes[k].outputs if o >= 0]
            if nodes and all(arrays[o] is not None for o in outputs):
                to_host, from_host = self.backend.to_host, self.backend.from_host
                host = {o: to_host(arrays[o]) for o in outputs}
                state.shape_fold = ShapeFold(nodes, {o: from_host(h) for o, h in host.items()}, host=host)
            else:
                state.shape_fold = None
        elif action == "replayed" and state.shape_fold is not None and not state.shape_fold.validated:
            fold = state.shape_fold
            to_host = self.backend.to_host
            differs = next((o for o, v in fold.values.items()
                            if arrays[o] is None or not np.array_equal(to_host(arrays[o]), to_host(v))), None)
            fold.validated = differs is None
            if differs is not None:
                state.shape_fold = None
                now = "released" if arrays[differs] is None else _short(to_host(arrays[differs]))
                return (f"shape fold dropped: {self.graph.values[differs].name!r} was "
                        f"{_short(fold.host[differs])} at the reference step, {now} at this replay")
        elif action != "replayed":
            state.shape_fold = None
        return None

    @staticmethod
    def fold_pending(state: SlotState) -> bool:
        """Whether a shape fold was found and awaits its check against the kernels."""
        fold = state.shape_fold
        return fold is not None and not fold.validated

    @staticmethod
    def baked_values(state: SlotState, step: Any) -> dict[int, tuple[Any, Any]]:
        """value id -> (array, host copy) of what a recording of `step` (a `StepRun`)
        may take as constants: the validated shape-fold values it reinstates. They are
        pure functions of shapes that no memo replay changes, the very same arrays every
        replay; a step that is not a replay retires every recording and the fold."""
        fold = state.shape_fold
        if fold is None or not fold.validated or not step.folded:
            return {}
        return {vid: (arr, fold.host[vid]) for vid, arr in fold.values.items()}

    @staticmethod
    def reinstate_shape_values(p: PlanNode, fold: ShapeFold, arrays: list, rec: Any) -> None:
        """A folded node's values put back (no kernel runs)."""
        for o in p.outputs:
            if o >= 0:
                arrays[o] = fold.values[o]
        if rec is not None:
            rec.node(p.index, "elided", 0.0)


def _short(value: Any, limit: int = 48) -> str:
    """A shape-fold value as a memo row names it: its elements, cut at `limit` characters."""
    text = str(np.asarray(value).tolist())
    return text if len(text) <= limit else text[:limit - 3] + "..."


__all__ = ["Dispatch", "PreparedStep", "StepPreparer", "bound_signature", "plain_call"]

"""How a step is prepared under the decode-plan memo (Stage 1) and served by the
cached view plan (Stage 2); the decisions themselves are in `memo.py`.

A mixin of `Executor`: it reads and writes the current slot's prepared state
(`self.state`, a `SlotState`: shapes, dispatch, buffers, memo, view plan, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..addresses import holds_now
from ..errors import MemoVerifyError
from ..ops.registry import baked_copy
from .memo import (
    STAGE2_MISMATCH_LIMIT,
    DecodePlanMemo,
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
from .plan import PlanNode
from .shapes import resolve
from .views import address, is_view_of


def bound_signature(bound: dict[int, Any]) -> tuple:
    """Identity of the caller's output buffers: value, address, shape, strides, dtype."""
    return tuple((vid, address(arr), arr.shape, arr.strides, arr.dtype.str) for vid, arr in bound.items())


class DecodeMemoSteps:
    """Stage 1 (shape replay) and Stage 2 (view reinstatement) for the executor."""

    def _replay_prepare(self, memo: DecodePlanMemo, bindings: dict[str, int], bound: dict[int, Any]) -> None:
        """Stage 1 replay: keep the invariant partition, re-substitute only the variant tail."""
        values, shapes = self.graph.values, self.state.shapes
        for shape, vids in memo.variant_groups:
            got = None if shape is None else resolve(shape, bindings)
            for vid in vids:
                shapes[vid] = got
        for vid, arr in bound.items():
            shapes[vid] = tuple(arr.shape)
            k, j = self.state.bound_slots[vid]
            self.state.dispatch[k].outs[j] = arr
        rec = self.recording
        events = [] if rec is not None else None  # a growing decode's dozens of buffer events, as one block
        for k, j, vid, owner in self.state.variant_preallocated:
            self.state.dispatch[k].outs[j] = self._buffer(owner, shapes[vid], values[vid].dtype, k, events)
        if events:
            rec.buffer_rows(tuple(events))

    def _verify_shapes_against_kernels(self, env: list) -> None:
        """Verify mode: every shape the replay served must be the shape the kernels
        actually produced this step (an independent witness, unlike a second resolve)."""
        values = self.graph.values
        for p in self.plan.nodes:
            for vid in p.outputs:
                served = self.state.shapes.get(vid) if vid >= 0 else None
                got = getattr(env[vid], "shape", None) if served is not None else None
                if got is not None and tuple(got) != served:
                    raise MemoVerifyError(
                        f"decode-plan memo replayed shape {served} for value {values[vid].name!r} "
                        f"but {p.node.label} produced {tuple(got)}")
        self.memo_stats.verified += 1

    def _memo_signature(self, feeds: dict[int, Any], bound: dict[int, Any]) -> tuple:
        """Caller-bound I/O, length-abstracted: value, role, dtype, declared symbolic shape."""
        key = (tuple((v, getattr(a, "dtype", None)) for v, a in feeds.items()),
               tuple((v, a.dtype) for v, a in bound.items()))
        cached = self.state.signature_cache.get(key)
        if cached is None:
            cached = self.state.signature_cache[key] = self._describe_bindings(feeds, bound)
        return cached

    def _describe_bindings(self, feeds: dict[int, Any], bound: dict[int, Any]) -> tuple:
        values = self.graph.values
        sig = [(values[v].name, "input", str(getattr(a, "dtype", "")), values[v].shape) for v, a in feeds.items()]
        sig += [(values[v].name, "output", str(a.dtype), values[v].shape) for v, a in bound.items()]
        return tuple(sorted(sig, key=lambda r: (r[0], r[1])))

    def _plan_step(self, feeds: dict[int, Any], bindings: dict[str, int],
                   bound: dict[int, Any]) -> tuple[str, str]:
        """Prepare this step; returns the memo action and its reason."""
        exact = (tuple(bindings.items()), bound_signature(bound))
        replan, self.state.replan = self.state.replan, None
        if replan is not None:
            # the last run found the prepared plan wrong (a kernel needed just-in-time
            # allocation, or an inferred symbol proved inconsistent): nothing prepared,
            # memoised or cached is trusted; start observing afresh
            self.state.memo, self.state.view_plan = None, None
            self.state.prev_bindings, self.state.prev_signature = dict(bindings), self._memo_signature(feeds, bound)
            self._steady = False
            self._full_prepare(bindings, bound)
            self.state.signature = exact
            return ("disabled", "decode memo off") if not self.options.decode_memo else (
                "primed", f"re-plan requested: {replan}")
        self._steady = exact == self.state.signature
        if not self.options.decode_memo:
            if exact != self.state.signature:
                self._full_prepare(bindings, bound)
                self.state.signature = exact
            self.state.view_plan = None
            return "disabled", "decode memo off"
        signature = self._memo_signature(feeds, bound)
        memo = self.state.memo
        why = memo.mismatch(bindings, signature) if memo is not None else None
        if memo is not None and why is None:
            stage2 = self._stage2_guard()
            if stage2 is None:
                self._replay_prepare(memo, bindings, bound)
                self.state.signature = exact
                self.state.prev_bindings, self.state.prev_signature = dict(bindings), signature
                self._steady = True
                return "replayed", "bindings match the memo"
            why = stage2
        prev, prev_sig = self.state.prev_bindings, self.state.prev_signature
        self.state.prev_bindings, self.state.prev_signature = dict(bindings), signature
        self.state.view_plan = None  # invalidated on every non-replay step
        # the same bindings and buffers as the last step, with no memo to disagree:
        # the prepared plan holds as it is (steady, e.g. a repeated fixed-shape run)
        self._steady = exact == self.state.signature and memo is None
        if not self._steady:
            self._full_prepare(bindings, bound)
            self.state.signature = exact
        if prev is not None and prev_sig == signature and growth_transition(prev, bindings):
            self._build_memo(prev, bindings, signature)
            return "rebuilt", why or "growth transition"
        self.state.memo = None
        if prev is None:
            return "primed", "first observation"
        if prev_sig != signature:
            return "primed", "binding signature changed: " + signature_diff(prev_sig, signature)
        return "primed", why or why_not_growth(prev, bindings)

    def _build_memo(self, prev: dict[str, int], bindings: dict[str, int], signature: tuple) -> None:
        varying = frozenset(s for s, v in bindings.items() if prev[s] != v)
        invariant, variant = {}, []
        for vid, shape in self.state.shapes.items():
            if shape_mentions(self.graph.values[vid].shape, varying):
                variant.append(vid)
            else:
                invariant[vid] = shape
        self.state.memo = DecodePlanMemo(dict(bindings), varying, invariant, variant, signature,
                                         group_by_shape(variant, self.graph.values))
        variant_set = set(variant)
        self.state.variant_preallocated = [s for s in self.state.preallocated if s[2] in variant_set or s[3] in variant_set]
        outputs = set(self.graph.outputs)
        self.state.handover = {vid: (k, j) for k, j, vid, owner in self.state.variant_preallocated
                               if vid == owner and vid in outputs}

    # -- Stage 2: the cached view plan ---------------------------------------------------

    def _stage2_guard(self) -> str | None:
        """None when the validated view plan's source buffers are where they were."""
        plan = self.state.view_plan
        if plan is None or not plan.validated:
            return None
        held = plan.held_sources
        if held is not None:
            try:
                if held[0](self.state.buffers) and held[1](self.env):
                    self.state.stage2_streak = 0
                    return None
            except KeyError:  # a source buffer was dropped: look at each
                pass
        for owner, (addr, cap) in plan.sources.items():
            buf = self.state.buffers.get(owner, self.env[owner] if owner in self.graph.initializers else None)
            if buf is None or address(buf) != addr or buf.nbytes != cap:
                self.state.stage2_streak += 1
                self.memo_stats.stage2_mismatches += 1
                if self.state.stage2_streak >= STAGE2_MISMATCH_LIMIT:
                    self.state.stage2_latched = self.memo_stats.stage2_latched = True
                name = self.graph.values[owner].name
                return f"view plan source {name!r} moved or resized"
        self.state.stage2_streak = 0
        # the very arrays just found in place (held, they cannot move or resize): the
        # slot's buffers, and the environment's entries of initializer sources
        owned = [owner for owner in plan.sources if owner in self.state.buffers]
        constant = [owner for owner in plan.sources if owner not in self.state.buffers]
        plan.held_sources = (holds_now(self.state.buffers, owned), holds_now(self.env, constant))
        return None

    # -- shape arithmetic folding ------------------------------------------------------

    def _shape_fold_after_run(self, action: str) -> None:
        """After a rebuild, keep the shape arithmetic `shape_fold_nodes` finds (private
        copies of its values); on the next replay, compare it with what the kernels
        computed, and trust it only if every value matched."""
        state = self.state
        if action == "rebuilt" and self.options.graph_optimization_level in ("extended", "all"):
            nodes = shape_fold_nodes(self.plan, state.shapes, state.memo.invariant, self.graph.initializers)
            outputs = [o for k in nodes for o in self.plan.nodes[k].outputs if o >= 0]
            if nodes and all(self.env[o] is not None for o in outputs):
                to_host, from_host = self.backend.to_host, self.backend.from_host
                host = {o: to_host(self.env[o]) for o in outputs}
                state.shape_fold = ShapeFold(nodes, {o: from_host(h) for o, h in host.items()}, host=host)
            else:
                state.shape_fold = None
        elif action == "replayed" and state.shape_fold is not None and not state.shape_fold.validated:
            fold = state.shape_fold
            to_host = self.backend.to_host
            fold.validated = all(self.env[o] is not None and np.array_equal(to_host(self.env[o]), to_host(v))
                                 for o, v in fold.values.items())
            if not fold.validated:
                state.shape_fold = None
        elif action != "replayed":
            state.shape_fold = None

    def shape_fold_pending(self) -> bool:
        """Whether a shape fold was found and awaits its check against the kernels."""
        fold = self.state.shape_fold
        return fold is not None and not fold.validated

    def baked_values(self, step: Any) -> dict[int, tuple[Any, Any]]:
        """value id -> (array, host copy) of what a recording of `step` (a `StepRun`)
        may take as constants: the validated shape-fold values it reinstates. They are
        pure functions of shapes that no memo replay changes, the very same arrays every
        replay; a step that is not a replay retires every recording and the fold."""
        fold = self.state.shape_fold
        if fold is None or not fold.validated or not step.folded:
            return {}
        return {vid: (arr, fold.host[vid]) for vid, arr in fold.values.items()}

    def _reinstate_shape_values(self, p: PlanNode, fold: ShapeFold, env: list, rec: Any) -> None:
        for o in p.outputs:
            if o >= 0:
                env[o] = fold.values[o]
        if rec is not None:
            rec.node(p.index, "elided", 0.0)

    def _stage2_after_run(self, action: str, step: Any) -> None:
        """Build candidates after a rebuild; validate them on the next replay (`step`:
        the run's `StepRun`, with the views it made)."""
        observed = step.observed
        if self.state.stage2_latched or not (self.options.views and self.options.view_plan):
            self.state.view_plan = None
            return
        if action == "rebuilt":
            self.state.view_plan = self._candidate_view_plan(observed)
        elif action == "replayed" and self.state.view_plan is not None and step.view_plan_stale:
            self.state.view_plan = None  # a runtime view parameter changed: re-derive from scratch
            self.state.stage2_streak += 1
            self.memo_stats.stage2_mismatches += 1
        elif action == "replayed" and self.state.view_plan is not None and not self.state.view_plan.validated:
            plan = self.state.view_plan
            same = all(vid in observed and observed[vid][1:] == geo[1:] for vid, geo in plan.views.items())
            same = same and all(self._param_keys(k) == keys for k, keys in plan.params.items())
            if same:
                plan.views = {vid: observed[vid] for vid in plan.views}
                plan.validated = True
                env = self.env
                plan.same_source = {}
                for k in plan.params:
                    self._note_same_source(plan, k, env)
            else:
                self.state.view_plan = None

    def _candidate_view_plan(self, observed: dict[int, tuple]) -> ViewPlan | None:
        """The view nodes `view_plan_admission` admits, with what the guard needs."""
        invariant = self.state.memo.invariant
        initializers = self.graph.initializers
        buffers = self.state.buffers

        def stable_owner(owner: int) -> bool:
            return (owner in buffers and owner in invariant) or owner in initializers

        nodes, views, sources, params = set(), {}, {}, {}
        for p in self.plan.nodes:
            if not (p.spec.produces_view and self.options.views):
                continue
            if view_plan_admission(p, invariant, observed, stable_owner, initializers) is not None:
                continue
            params[p.index] = self._param_keys(p.index)
            nodes.add(p.index)
            for v in p.outputs:
                if v >= 0:
                    views[v] = observed[v]
                    owner = observed[v][1]
                    buf = buffers.get(owner, self.env[owner])
                    sources[owner] = (address(buf), buf.nbytes)
        return ViewPlan(frozenset(nodes), views, sources, params) if nodes else None

    def _param_keys(self, k: int) -> tuple:
        """What node k's views are a function of, besides constants: the geometry of
        its source (a view produced this step may sit elsewhere, e.g. after a Slice
        whose start moved) and the values of its runtime parameter inputs (every
        input after the source that is not an initializer)."""
        env = self.env
        params = self._view_params.get(k)
        if params is None:  # the plan's inputs of node k: fixed for the executor's life
            inputs = self.plan.nodes[k].inputs
            params = self._view_params[k] = (inputs[0], tuple(
                vid for vid in inputs[1:] if vid >= 0 and vid not in self.graph.initializers))
        first, runtime = params
        source = env[first]
        keys = [(first, None) if source is None else
                (first, address(source), source.shape, source.strides)]
        on_host = self.backend.buffers_are_host
        fold = self.state.shape_fold
        for vid in runtime:
            value = env[vid]
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

    def memo_state(self) -> str:
        if self.state.stage2_latched:
            return "latched"
        return self.state.view_plan.state if self.state.view_plan is not None else "none"

    def _note_same_source(self, plan: ViewPlan, k: int, env: list) -> None:
        """Keep node k's source and runtime parameters by identity (`ViewPlan.same_source`)
        when every parameter is a validated shape-fold value (or there is none)."""
        first, runtime = self._view_params[k]
        if env[first] is None:
            return
        fold = self.state.shape_fold
        if runtime and (fold is None or not fold.validated
                        or any(env[v] is None or env[v] is not fold.values.get(v) for v in runtime)):
            return
        plan.same_source[k] = holds_now(env, (first,) + runtime)

    def _reinstate_views(self, p: PlanNode, plan: ViewPlan, step: Any) -> bool:
        """Stage 2: the node's views are as they were; put them back without dispatching.
        False (nothing reinstated) when a runtime parameter of the node changed."""
        env, rec, pinned = step.env, step.rec, step.pinned
        same = plan.same_source.get(p.index)
        if same is None or not same(env):
            if self._param_keys(p.index) != plan.params[p.index]:
                step.view_plan_stale = True
                return False
            self._note_same_source(plan, p.index, env)
        verify = self.options.decode_memo_verify
        if verify:
            fresh = p.fn([env[i] if i >= 0 else None for i in p.inputs], [None] * len(p.outputs))
        views = plan.views
        for j, vid in enumerate(p.outputs):
            if vid < 0:
                continue
            view, owner, shape, strides, offset = views[vid]
            if verify and not (
                    is_view_of(fresh[j], view) and address(fresh[j]) == address(view)
                    and fresh[j].shape == view.shape and fresh[j].strides == view.strides):
                raise MemoVerifyError(f"cached view plan reinstated a stale view for {p.node.label}")
            env[vid] = view
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

"""Runs a Plan: binds symbols, resolves shapes, lays out storage, dispatches kernels.

Per binding signature (symbol values + caller-bound output buffers) the executor
prepares once: resolved shapes, a `StoragePlan` (owners, views, in-place aliases,
release points) and each node's preallocated output positions. Steps that repeat the
signature skip straight to dispatch.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from ..errors import AllocationError, InputError, KernelError, MechanismDivergenceError, WorkbenchError
from ..ir.graph import Graph
from ..ops.registry import CaptureViolation, host_read
from ..rewrite.kernel_info import requantizes_activations
from .capture import SlotCapture
from .capture_runner import CaptureRunner
from .memo import MemoStats
from .options import SessionOptions
from .plan import KernelCache, Plan, PlanNode, build_plan
from .prepare import Dispatch, PreparedStep, StepPreparer
from .shadow import Shadow
from .shapes import SymbolBinder, input_symbols, resolve
from .slot_state import SlotState
from .step_run import StepRun
from .step_trace import StepTrace
from .storage import ALIAS
from .views import ELEMENT_STRIDES, KnownAddresses, address, element_strides, is_view_of


class Executor:
    """Executes one graph. Owner buffers persist across runs while their shape holds.

    `fresh_arrays` executors (subgraph bodies) never preallocate: each run's values are
    fresh arrays, so a Loop can keep every iteration's outputs.
    """

    def __init__(self, graph: Graph, backend: Any, *, options: SessionOptions | None = None,
                 cache: KernelCache | None = None, fresh_arrays: bool = False):
        self.graph = graph
        self.backend = backend
        self._host_clock = getattr(backend, "host_clock", None)  # see `Backend.host_clock`
        self.options = options or SessionOptions()
        self.cache = cache or KernelCache()
        self.fresh_arrays = fresh_arrays
        rounding = self.options.onnxruntime_rounding
        #: whether float32 kernels round as onnxruntime's (`SessionOptions.onnxruntime_rounding`)
        self.onnxruntime_rounding = rounding == "always" or (rounding == "auto" and requantizes_activations(graph))
        self.plan: Plan = build_plan(graph, backend.xp, self.cache, self._subgraph_runner,
                                     self.onnxruntime_rounding, rounding != "never")
        #: outputs of Ifs that may be skipped: never lent to an in-place write
        self._skippable_outputs = {o for p in self.plan.nodes if p.skippable_if for o in p.outputs if o >= 0}
        #: skip an If whose predicate is unchanged (off for shadow re-execution)
        self.skip_unchanged_if = True
        self.shadow = Shadow(self.options.shadow if not fresh_arrays else "off", self.options.shadow_fraction)
        #: the array each value id holds now (None: not made yet, or released); indexed
        #: like `graph.values`, whose entries describe the values these arrays hold
        self.arrays: list[Any] = [None] * len(graph.values)
        for vid, arr in graph.initializers.items():
            self.arrays[vid] = backend.from_host(arr)
        self.input_symbols = input_symbols(graph)
        self._binder = SymbolBinder(graph)
        self._untrusted: set[str] = set()  # inferred symbols that proved inconsistent
        #: value id -> its declared (axis, symbol) dims a just-in-time result reveals (`_adopt`)
        self._revealed: dict[int, tuple] = {}
        self._resident = 0  # bytes held in every slot's buffers
        self._peak = 0
        #: per slot ("primary", "verify"): everything prepared for it; `state` is current
        self.slots: dict[str, SlotState] = {"primary": SlotState("primary")}
        self.state = self.slots["primary"]
        self.memo_stats = MemoStats()
        #: plan indices whose preallocated outputs had to be dropped (shape inference disagreed)
        self.kernel_allocated: set[int] = set()
        #: a workbench.trace Recording to emit into, or None (tracing off)
        self.recording: Any = None
        #: addresses of the arrays this step and the last read (staleness checks, views, io rows)
        self.addresses = KnownAddresses()
        #: every trace row the executor writes, and what they keep from step to step
        self.step_trace = StepTrace(self.plan, graph, self.addresses)
        self.capture_runner = CaptureRunner(self.plan, graph, backend, self.options, self.arrays, self.input_symbols,
                                            self.step_trace)
        self._if_predicates: dict[int, bool] = {}
        #: the last step's prepared plan held as it was (`PreparedStep.steady`)
        self._steady = False
        #: time the eager nodes' kernels though untraced (an If branch run as a graph of its
        #: own, while the enclosing graph is traced: its `branch_capture` row's eager_us)
        self.time_kernels = False
        #: the last run's scratch (`StepRun`); a new one every run
        self.step: StepRun | None = None
        #: prepares each step: the full resolve, or a decode-plan memo replay
        self.preparer = StepPreparer(graph, self.plan, self.options, backend, self.arrays, self.memo_stats,
                                     self._buffer, fresh_arrays=fresh_arrays,
                                     skippable_outputs=self._skippable_outputs,
                                     kernel_allocated=self.kernel_allocated, untrusted=self._untrusted)

    def _enter_slot(self, slot: str) -> None:
        if slot != self.state.name:
            self.state = self.slots.setdefault(slot, SlotState(slot))

    def slot_capture(self, slot: str) -> SlotCapture:
        state = self.slots.get(slot)
        return state.capture if state is not None else SlotCapture()

    # -- buffers --------------------------------------------------------------------

    def _buffer(self, vid: int, shape: tuple[int, ...], dtype: np.dtype, plan_index: int = -1,
                events: list | None = None) -> Any:
        """`vid`'s buffer of this shape and dtype: the slot's own again, or a new one. Its
        buffer event goes to the Recording, or onto `events` (its fields, for a caller
        that hands a step's many events over at once: `Recording.buffer_rows`)."""
        buf = self.state.buffers.get(vid)
        if buf is not None and buf.shape == shape and buf.dtype == dtype:
            if events is not None:
                events += ("reuse", vid, buf.nbytes, plan_index)
            elif self.recording is not None:
                self.recording.buffer("reuse", vid, buf.nbytes, plan_index)
            return buf
        if buf is not None:
            self._resident -= buf.nbytes
        try:
            buf = self.backend.allocate(shape, dtype)
        except (MemoryError, ValueError) as error:
            node = self.plan.nodes[plan_index].node.label if plan_index >= 0 else "the step"
            nbytes = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.float64))
            raise AllocationError(
                f"cannot allocate {nbytes / 2**30:.1f} GiB for value {self.graph.values[vid].name!r} "
                f"(shape {tuple(shape)}, {np.dtype(dtype)}) at {node}: {type(error).__name__}: {error}. "
                "Check the model's declared shapes and the input sizes") from error
        self.state.buffers[vid] = buf
        self._resident += buf.nbytes
        self._peak = max(self._peak, self._resident)
        if events is not None:
            events += ("alloc", vid, buf.nbytes, plan_index)
        elif self.recording is not None:
            self.recording.buffer("alloc", vid, buf.nbytes, plan_index)
        return buf

    def _release(self, owner: int, plan_index: int, arrays: list, released: dict[int, int]) -> None:
        buf = self.state.buffers.pop(owner, None)
        if buf is not None:
            self._resident -= buf.nbytes
            if self.recording is not None:
                self.recording.buffer("release", owner, buf.nbytes, plan_index)
        for vid in self.state.storage.sharers.get(owner, ()):
            arrays[vid] = None
        released[owner] = plan_index

    # -- running --------------------------------------------------------------------

    def run(self, feeds: dict[int, Any], bound_outputs: dict[int, Any] | None = None,
            *, slot: str = "primary", phase: str = "") -> list[Any]:
        """Run the plan on `feeds` (value id -> array); returns the executor's `arrays`.

        `bound_outputs` (value id -> array) are written in place: the caller's arrays
        become those values' buffers for this run.
        """
        t_start = time.perf_counter()
        arrays, bound, rec = self.arrays, bound_outputs or {}, self.recording
        for vid, arr in feeds.items():
            arrays[vid] = arr
        self.addresses.next_step()
        if self.fresh_arrays:  # a Loop or Scan body: every run prepared afresh, all its nodes eager
            return self._run_fresh(bound)
        self._enter_slot(slot)
        bindings = self._binder.bind(feeds)
        if rec is not None:
            rec.begin_step(slot=slot, phase=phase, bindings=bindings)
        self._peak = self._resident
        prepared = self.preparer.prepare(self.state, feeds, bindings, bound, rec)
        self._steady = prepared.steady
        setattr(self.memo_stats, prepared.action, getattr(self.memo_stats, prepared.action) + 1)
        resolve_s = time.perf_counter() - t_start
        step = self._new_step(dict(bindings), prepared.action)  # just-in-time symbols join its bindings
        snapshot = self._shadow_snapshot(feeds, bound, prepared.action)
        capture_mode = self.capture_runner.run_step(step, prepared.steady, bound, slot)
        if bound:
            self._fill_bound(arrays, bound)
        if prepared.action == "replayed" and self.options.decode_memo_verify:
            self.preparer.verify_shapes(step.state, arrays)
        fold_dropped = self.preparer.after_run(step.state, prepared.action, step)
        divergences = self._shadow_check(snapshot, step, prepared.action, slot)
        views_reused = sum(len(self.plan.nodes[k].outputs) for k in step.reinstated)
        self.memo_stats.dispatch_elided += len(step.reinstated)
        self.memo_stats.views_reused += views_reused
        if rec is not None:
            self._trace_step(rec, step, prepared, phase, slot, feeds, bound, capture_mode == "replay", resolve_s,
                             views_reused, fold_dropped)
            rec.end_step(time.perf_counter() - t_start, resident_peak_bytes=self._peak)
        if divergences and self.options.shadow == "raise":
            raise divergence_error(divergences)
        return arrays

    def _run_fresh(self, bound: dict[int, Any]) -> list[Any]:
        """A run on fresh arrays: prepared once (no shapes resolved, nothing
        preallocated), every node dispatched, nothing memoised, captured or traced."""
        if self.options.decode_memo:
            self.memo_stats.ineligible += 1  # a nested control-flow body
        if self.state.signature is not None:
            self.preparer.full(self.state, {}, bound)
            self.state.signature = None
        step = self._new_step({}, "")
        self._run_nodes(step, range(len(step.state.dispatch)))
        return self.arrays

    def _new_step(self, bindings: dict[str, int], action: str) -> StepRun:
        """This run's scratch, with what the memo serves it: the nodes a validated view
        plan may elide and a validated shape fold reinstates, on a replayed step."""
        state, rec = self.state, self.recording
        # a traced step's eager nodes log their rows onto the Recording's node log,
        # timed by the host clock where the backend has one (`_dispatch_node`)
        if rec is not None:
            node_log, clock = rec.node_log(), self._host_clock
        elif self.time_kernels and self._host_clock is not None:
            node_log, clock = [], self._host_clock  # (plan index, "eager", seconds) per eager node
        else:
            node_log, clock = None, None
        step = self.step = StepRun(state, self.arrays, bindings, rec, node_log, clock, owners=state.storage.owner)
        step.run_nodes = functools.partial(self._run_nodes, step)
        if action == "replayed":
            plan = state.view_plan
            if plan is not None and plan.validated:
                step.elided = plan.nodes
            fold = state.shape_fold
            if fold is not None and fold.validated:
                step.folded = fold.nodes
        step.baked = self.preparer.baked_values(state, step)
        step.fold_pending = self.preparer.fold_pending(state)
        return step

    def _trace_step(self, rec: Any, step: StepRun, prepared: PreparedStep, phase: str, slot: str,
                    feeds: dict[int, Any], bound: dict[int, Any], replayed: bool, resolve_s: float,
                    views_reused: int, fold_dropped: str | None) -> None:
        """The step's memo, liveness and io_buffers rows (`StepTrace`; the last two where
        the Recording keeps the memory tables); `fold_dropped`: why the shape fold failed
        its check this step, added to the memo row's reason."""
        trace, state = self.step_trace, step.state
        reason = prepared.reason if fold_dropped is None else f"{prepared.reason}; {fold_dropped}"
        trace.memo(rec, state, self.preparer.view_plan_state(state), phase, slot, prepared.action,
                   reason, resolve_s, len(step.reinstated), views_reused)
        if not rec.memory:
            return
        restored = self.capture_runner.replay_restores(state.capture) if replayed else None
        trace.liveness(rec, state, step.arrays, step.owners, step.released, step.pinned, restored)
        trace.io_buffers(rec, feeds, bound, step.arrays)

    # -- the node loop -----------------------------------------------------------------

    def _run_nodes(self, step: StepRun, indices: Any, recorder: Any = None) -> None:
        """Run plan nodes `indices` in order: a shape-fold value or a cached view
        reinstated where the memo serves it, a bare kernel call (`plain_call`) straight
        from here, anything else through `_dispatch_node`. While a segment is recorded,
        `recorder` (`capture.LaunchRecorder`) is told of each node: the one hook capture
        has here. Called once per eager stretch of a step: what the loop reads is
        fetched once, into locals."""
        arrays, rec, node_log, clock = step.arrays, step.rec, step.node_log, step.clock
        dispatch = step.state.dispatch
        folded, elided = step.folded, step.elided
        # a bare call's node is timed by the host clock; the backend's timers (a device
        # clock) and a recording take the full dispatch
        plain_ok = recorder is None and (node_log is None or clock is not None)
        for k in indices:
            d = dispatch[k]
            if k in folded:
                self.preparer.reinstate_shape_values(d.p, self.state.shape_fold, arrays, rec)
                continue
            if k in elided and self.preparer.reinstate_views(d.p, self.state.view_plan, step):
                step.reinstated.append(k)
                continue
            call = d.plain
            if call is None or not plain_ok:
                self._dispatch_node(d, step, recorder)
                continue
            fn, inputs_of, outs, outputs, alias = call
            ins = inputs_of(arrays)
            try:
                if node_log is None:
                    res = fn(ins, outs)
                else:
                    t0 = clock()
                    res = fn(ins, outs)
                    node_log += (k, "eager", clock() - t0)  # the Recording's own list, extended in place
            except WorkbenchError:
                raise
            except Exception as e:  # noqa: BLE001 - reported or retried as `_dispatch_node` does
                res = self._retry_unallocated(d.p, ins, outs, e)
            for j, vid in enumerate(outputs):
                r = res[j]
                arrays[vid] = r if r is outs[j] else self._store_output(d, j, vid, r, ins, step)
            if alias is not None and rec is not None:
                rec.alias(*alias, k)

    # -- shadow verification (see shadow.py) ----------------------------------------------

    def _shadow_snapshot(self, feeds: dict[int, Any], bound: dict[int, Any], action: str) -> tuple | None:
        """Private copies of the feeds and bound outputs, when this step may be served
        by a mechanism and is due for shadowing. Copied before the step (a bound output
        may alias a feed, e.g. a KV cache written in place), keeping that aliasing: the
        reference sees the same buffer roles (GroupQueryAttention's shared-buffer mode
        depends on them)."""
        shadow = self.shadow
        if not shadow.on:
            return None
        may_serve = action == "replayed" or (self._steady and self.state.capture.installed) \
            or bool(self._skippable_outputs)
        if not may_serve or not shadow.due():
            return None
        copies: dict[int, Any] = {}  # id of the caller's array -> its private copy

        def private(a: Any) -> Any:
            if not hasattr(a, "shape"):
                return a
            if id(a) not in copies:
                copies[id(a)] = self.backend.from_host(self.backend.to_host(a))
            return copies[id(a)]

        return ({vid: private(a) for vid, a in feeds.items()}, {vid: private(a) for vid, a in bound.items()})

    def _shadow_check(self, snapshot: tuple | None, step: StepRun, action: str, slot: str) -> list:
        if snapshot is None:
            return []
        arrays, rec = step.arrays, step.rec
        mechanisms = {k: "capture_replay" for k in step.replayed_nodes}
        mechanisms.update({k: "view_plan" for k in step.reinstated})
        mechanisms.update({k: "shape_fold" for k in step.folded})
        mechanisms.update({k: "if_skip" for k in step.skipped_ifs})
        if not mechanisms and action != "replayed":
            self.shadow.served -= 1  # nothing was served after all: not a shadowed step
            return []
        reference = self.shadow.reference(
            lambda options: Executor(self.graph, self.backend, options=options, cache=self.cache),
            self.options)
        reference_arrays = reference.run(*snapshot, slot=slot)
        found = self.shadow.compare(self, arrays, reference_arrays, mechanisms,
                                    "decode_memo" if action == "replayed" else "storage")
        if rec is not None:
            self.step_trace.shadow(rec, slot, found, sorted(set(mechanisms.values()) | (
                {"decode_memo"} if action == "replayed" else set())))
        return found

    def _dispatch_node(self, d: Dispatch, step: StepRun, recorder: Any = None) -> None:
        """Run one node with all a node may need around its kernel. While traced, its
        row goes onto the step's node log, timed by the step's clock (the host's, or
        None: the backend's timers). While a segment is recorded, `recorder`
        (`capture.LaunchRecorder`) is told of the node once it has run."""
        p = d.p
        arrays, bindings, rec, node_log, clock = step.arrays, step.bindings, step.rec, step.node_log, step.clock
        ins = [arrays[i] if i >= 0 else None for i in p.inputs]
        if d.skippable and not self.fresh_arrays and self.skip_unchanged_if \
                and self._if_unchanged(p, ins[0], arrays):
            step.skipped_ifs.append(p.index)
            if rec is not None:
                rec.node(p.index, "elided", 0.0)
            return
        outs = d.outs
        if d.lazy or d.dynamic:
            outs = list(outs)
            for j, owner, vid, dtype in d.lazy:
                outs[j] = self._buffer(owner, self.state.shapes[vid], dtype, p.index)
            for j, vid in d.dynamic:
                v = self.graph.values[vid]
                shape = resolve(v.shape, bindings)
                if shape is not None:
                    outs[j] = self._buffer(self.state.storage.owner.get(vid, vid), shape, v.dtype, p.index)
        for pos in d.contiguous:
            x = ins[pos]
            if x is not None and not x.flags.c_contiguous:
                ins[pos] = self._contiguous_copy(x, recorder)
                if rec is not None:
                    rec.materialize(p.index, p.inputs[pos], x.nbytes, "kernel needs a contiguous input")
        # device time, not launch time: the backend's timer waits for the node's kernels
        if node_log is not None:
            t0 = clock() if clock is not None else self.backend.start_timer()
        try:
            res = p.fn(ins, outs)
        except CaptureViolation as violation:
            violation.plan_index = p.index  # the capture runner quarantines exactly this node's op
            raise
        except WorkbenchError:
            raise
        except Exception as e:  # noqa: BLE001 - every kernel failure is reported the same way
            if recorder is not None:  # no retry while recording: a retry's launches would not be replayed
                raise kernel_error(p, self.graph.values, ins, e) from e
            res = self._retry_unallocated(p, ins, outs, e)
        if node_log is not None:  # onto the Recording's node log: no call into it between kernels
            node_log += (p.index, "eager", clock() - t0 if clock is not None else self.backend.stop_timer(t0))
        for j, vid in enumerate(p.outputs):
            if vid < 0:
                continue
            r = res[j]
            arrays[vid] = r if r is outs[j] else self._store_output(d, j, vid, r, ins, step, outs)
        if recorder is not None:
            recorder.dispatched(d, ins, outs, arrays, step.owners)
        if rec is not None and d.alias is not None:
            rec.alias(*d.alias, p.index)
        for owner in d.release:
            self._release(owner, p.index, arrays, step.released)

    def _store_output(self, d: Dispatch, j: int, vid: int, r: Any, ins: Any, step: StepRun,
                      outs: list | None = None) -> Any:
        """What output `j` (value `vid`) of node `d` holds when the kernel did not hand
        back its preallocated array: a view of input 0, its result copied into that
        array, or a just-in-time result (a kept copy where a captured segment reads it)."""
        p = d.p
        o = (d.outs if outs is None else outs)[j]
        if d.view and o is None:
            value = self._take_view(p, vid, r, ins[0], step)
            if vid in self.state.capture.kept_values and step.owners.get(vid) == vid:
                value = self._keep(vid, value)  # a layout copy a captured segment reads
            return value
        if o is not None and getattr(r, "shape", None) == o.shape:
            o[...] = r
            return o
        value = self._adopt(p, vid, r, step.bindings)
        if vid in self.state.capture.kept_values:  # read by a captured segment: keep its address
            value = self._keep(vid, value)
        return value

    def _keep(self, vid: int, arr: Any) -> Any:
        """A just-in-time result a captured segment reads, copied into the one buffer the
        slot keeps for it (while its shape and dtype hold), so the graph's input stays put."""
        kept = self.state.capture.kept
        buf = kept.get(vid)
        if buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype or type(buf) is not type(arr):
            buf = kept[vid] = self.backend.allocate(arr.shape, arr.dtype)
            self._resident += buf.nbytes
        buf[...] = arr
        return buf

    def _contiguous_copy(self, x: Any, recorder: Any) -> Any:
        """A C-contiguous copy of a strided input. While recording, the copy goes into
        a buffer the graph keeps and is itself a recorded launch, so every replay
        copies the current contents (not the capture run's)."""
        copy = self.backend.allocate(tuple(x.shape), x.dtype)
        copy[...] = x
        if recorder is not None:
            recorder.copied(x, copy)
        return copy

    def _request_replan(self, why: str) -> None:
        """Every slot's next run prepares from scratch (checked before any memo replay)."""
        for state in self.slots.values():
            state.signature = object()
            state.replan = state.replan or why

    def _if_unchanged(self, p: PlanNode, predicate: Any, arrays: list) -> bool:
        """An If whose predicate is as last step and whose outputs are still resident
        need not re-run its branch (e.g. LongRoPE's cache selector during decode).
        Only for branches that read nothing from the enclosing graph: then the
        predicate alone decides the outputs."""
        value = bool(host_read(predicate).reshape(-1)[0])
        same = self._if_predicates.get(p.index) == value
        self._if_predicates[p.index] = value
        return same and all(arrays[o] is not None for o in p.outputs if o >= 0)

    def _take_view(self, p: PlanNode, vid: int, r: Any, source: Any, step: StepRun) -> Any:
        """A layout op's result: a zero-copy view of its input's owner, or a materialised copy."""
        rec = step.rec
        if is_view_of(r, source):
            owner = step.owners.get(p.inputs[0], p.inputs[0])
            step.set_owner(vid, owner)
            pinned = step.pinned
            if owner not in pinned:
                pinned.add(owner)
                if rec is not None:
                    rec.buffer("pin", owner, 0, p.index)
            base = step.owner_address.get(owner)
            if base is None:
                base = step.owner_address[owner] = address(self.arrays[owner])
            strides = ELEMENT_STRIDES.get((r.strides, r.itemsize))  # inline: tens of views a step
            geometry = (r.shape, strides if strides is not None else element_strides(r), address(r) - base)
            step.observed[vid] = (r, owner, *geometry)
            if rec is not None:
                rec.view(vid, owner, *geometry, p.index)
            return r
        r = self._adopt(p, vid, r, step.bindings)
        step.set_owner(vid, vid)  # a view that had to copy owns its bytes
        if rec is not None and hasattr(r, "nbytes"):
            rec.materialize(p.index, vid, r.nbytes, "layout op could not alias its input")
        return r

    def output_for_caller(self, vid: int) -> Any:
        """Graph output `vid` of the last run as the caller gets it: a host copy, or the
        run's own buffer where the executor is done with it. A growing KV cache's present
        owns a buffer that every memo replay allocates anew at its new length, so no
        later step writes into it: on a host backend it is handed over (dropped from the
        slot's buffers and its node's output position), which saves a copy per output per
        step and hands the caller the array the next step's past will be."""
        value = self.arrays[vid]
        where = self.state.handover.get(vid)  # (plan index, output position)
        if where is not None and self.backend.buffers_are_host and self.state.buffers.get(vid) is value:
            k, j = where
            dispatch = self.state.dispatch[k]
            if dispatch.outs[j] is value:
                del self.state.buffers[vid]
                self._resident -= value.nbytes
                dispatch.outs[j] = None  # the next replay's `StepPreparer.replay_shapes` gives it a new one
                return value
        return self.backend.to_host(value)

    def branch_output(self, vid: int) -> Any:
        """Output `vid` of an If branch's last run, as the If hands it on: handed over
        where `output_for_caller` would, else a copy on the backend. The branch's next
        run writes into its own buffers; no graph reads an If's outputs after the If ran
        again as things stand (a Loop body's If keeps fresh arrays), and the copy keeps
        it so should one."""
        value = self.arrays[vid]
        if value is None or not hasattr(value, "shape"):
            return value
        if vid in self.state.handover and self.backend.buffers_are_host:
            return self.output_for_caller(vid)
        return value.copy()

    def _fill_bound(self, arrays: list, bound: dict[int, Any]) -> None:
        for vid, arr in bound.items():
            value = arrays[vid]
            if value is arr:
                continue
            if getattr(value, "shape", None) != arr.shape:
                raise KernelError(
                    f"bound output {self.graph.values[vid].name!r} has shape {tuple(arr.shape)} but the "
                    f"model produced {tuple(getattr(value, 'shape', ()))}"
                )
            arr[...] = value
            arrays[vid] = arr

    def _retry_unallocated(self, p: PlanNode, ins: list, outs: list, error: Exception) -> Any:
        """A kernel failed: if we had preallocated, shape inference may be wrong; retry once."""
        if any(o is not None for o in outs):
            try:
                res = p.fn(ins, [None] * len(outs))
            except Exception:  # noqa: BLE001 - report the original failure below
                pass
            else:
                self.kernel_allocated.add(p.index)
                self._request_replan(f"{p.node.label} needed just-in-time allocation")
                return res
        raise kernel_error(p, self.graph.values, ins, error) from error

    def _adopt(self, p: PlanNode, vid: int, r: Any, bindings: dict[str, int]) -> Any:
        """Take a just-in-time result: fix its dtype and bind the symbols its shape reveals."""
        value = self.graph.values[vid]
        if r is None and value.kind in ("optional", "unknown"):
            return r  # an empty optional
        if r is None:
            raise KernelError(f"{p.node.label} produced no value for output {value.name!r}")
        if value.kind != "tensor" or isinstance(r, (list, dict)):
            return r
        r = self.backend.adopt(r)
        if value.dtype is not None and r.dtype != value.dtype:
            r = r.astype(value.dtype)
        revealed = self._revealed.get(vid)
        if revealed is None:  # the declared shape is the graph's: worked out once per value
            revealed = self._revealed[vid] = tuple(
                (axis, d) for axis, d in enumerate(value.shape or ()) if isinstance(d, str) and d not in self.input_symbols)
        if revealed and len(value.shape) == r.ndim:
            shape = r.shape
            for axis, d in revealed:
                got, have = shape[axis], bindings.get(d)
                if have is None:
                    bindings[d] = got
                elif have != got:
                    self._untrusted.add(d)
                    self._request_replan(f"symbol {d} is {have} and {got} in one run")
        return r

    # -- control flow -----------------------------------------------------------------

    def _subgraph_runner(self, graph: Graph, *, reusable: bool = False):
        """A body's runner. `reusable` (an If's branch, whose values no later run of it
        needs), where this executor is not itself a Loop or Scan body's: the branch runs
        as a graph of its own whose inputs are the values it reads from outside, with the
        decode-plan memo, preallocated buffers, views and captured segments a top-level
        graph has (the If itself is a seam; its slot is the caller's; each run's
        `branch_capture` row tells what the branch replayed), and hands each output over
        or copies it, as a top-level
        run does for its caller (optimum's merged small llama, whose whole model is an
        If's branch, three sessions each way decoding in turn: 5.60 -> 4.74 ms a step on
        a busy machine; 1.72-1.87 -> 1.28-1.37 of onnxruntime's step). Otherwise each run's
        values are fresh arrays: a tiny branch costs about 5 us a run more with the memo's
        bookkeeping, which a Loop repeating it would pay every iteration."""
        formal = list(graph.inputs)
        outer_ids = {graph.values[v].name: v for v in graph.outer_inputs}
        outputs = list(graph.outputs)
        reusable = reusable and not self.fresh_arrays
        if reusable:
            own = dataclasses.replace(graph, inputs=formal + list(graph.outer_inputs), outer_inputs=[])
            child = Executor(own, self.backend, options=self.options, cache=self.cache)
        else:
            child = Executor(graph, self.backend, options=self.options, cache=self.cache, fresh_arrays=True)

        def run(inputs: list, outer: dict[str, Any]) -> list:
            nonlocal child, reusable
            feeds = {vid: arr for vid, arr in zip(formal, inputs)}
            for name, vid in outer_ids.items():
                feeds[vid] = outer[name]
            if reusable:
                try:
                    child.time_kernels = self.recording is not None
                    child.run(feeds, slot=self.state.name)
                    if self.recording is not None:
                        self.step_trace.branch(self.recording, self.state.name, graph,
                                               child.capture_runner.branch_fields(child.step))
                except InputError:
                    # the shapes declared for the values it reads (inferred, or a model's
                    # own value_info) disagree with what arrives, which binding symbols
                    # from them refuses before any node runs: run it on fresh arrays
                    child, reusable = Executor(graph, self.backend, options=self.options, cache=self.cache,
                                               fresh_arrays=True), False
                else:
                    return [child.branch_output(o) for o in outputs]
            arrays = child.run(feeds)
            return [arrays[o] for o in outputs]

        run.executor = child  # type: ignore[attr-defined]
        return run


def divergence_error(divergences: list) -> MechanismDivergenceError:
    """The error a shadow check that found `divergences` raises (shadow="raise")."""
    first = divergences[0]
    return MechanismDivergenceError(
        f"{first.mechanism} changed a value: node {first.node!r} ({first.op_type}, plan index "
        f"{first.plan_index}) output {first.value!r} differs from eager execution by "
        f"{first.max_abs_err:g} (shape {first.shape_got}, eager {first.shape_expected}); "
        f"{len(divergences)} divergent value(s) this step")


def kernel_error(p: PlanNode, values: list, ins: list, error: Exception) -> KernelError:
    """The KernelError for a failed node: its label, each input's shape and dtype, the
    cause; `plan_index` travels with it."""
    shapes = ", ".join(
        f"{values[i].name}{tuple(getattr(a, 'shape', ()))}:{getattr(a, 'dtype', type(a).__name__)}"
        for i, a in zip(p.inputs, ins) if i >= 0
    )
    err = KernelError(f"{p.node.label} failed on inputs [{shapes}]: {type(error).__name__}: {error}")
    err.plan_index = p.index
    return err


__all__ = ["ALIAS", "Executor"]

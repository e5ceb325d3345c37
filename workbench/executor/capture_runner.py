"""Runs a step through captured segments: warm-up, capture, replay, retire, quarantine.

The executor hands each step to `CaptureRunner.run_step` once it has prepared
the step's buffers. Per slot the lifecycle is:

    eager warm-up  ->  capture (record each captured segment)  ->  replay ... replay
        ^                                                             |
        +------------- retire (binding changed, re-plan, failure) ----+

A kernel that performs a host read while being recorded raises
`CaptureViolation`: its op type is quarantined for the executor, the step is
re-run eagerly (so it still completes correctly) and the next steady step
re-segments with that op as a seam.

The capture rule (`Backend.capture_executes_work`): on CUDA a capture step records
and computes nothing, so nothing may read, while a segment is recorded, what only
running it would produce. Everything the capture step relies on either comes from an
eager step or makes its node a seam with a reason:

- values a later seam reads: each segment is launched right after it is recorded
  (`_capture`), before the next seam runs;
- output shapes: a captured node writes a preallocated buffer whose shape the step's
  resolution gave, or one it sizes just in time from its inputs' shapes (the graph
  keeps the array the recording made; every replay checks the segment's input shapes,
  which fix it); an output sized by input values declines (`data_dependent_shape`);
- host reads of values: the kernel declines (`host_read`) unless every value it reads
  is a validated shape-fold value (`baked`: host copies taken at an eager rebuild step
  and checked at an eager replay; `run_step` does not capture while a fold awaits its
  check), and a read anyway raises `CaptureViolation` (quarantine);
- view geometry (`StepRun.observed`), the Stage-2 guard (`StepPreparer.param_keys`: fold values'
  host twins inside segments), memo verification: addresses, shapes and strides,
  which a recorded launch has as a real one does;
- the shadow check, bound-output copies and the caller's outputs: after the step,
  after every launch; node timings while recording: the host clock, events cannot sync;
- the stream: every kernel is issued inside the session's `Backend.work_scope`, so on
  the stream that records (`CudaBackend.begin_capture` refuses to start elsewhere).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..addresses import address
from ..errors import KernelError, MechanismDivergenceError
from ..ops.registry import CaptureViolation, recording_launches
from .capture import (
    CaptureDecline,
    CapturedGraph,
    LaunchRecorder,
    SlotCapture,
    aliased_owners,
    binding_signature,
    constant_nodes,
    external_inputs,
    growing_symbols,
    node_decline,
    segment_plan,
    shape_derived_values,
    small_enough_to_bake,
)
from .step_run import StepRun
from .step_trace import StepTrace


class CaptureRunner:
    """The capture side of an executor: what it runs is fixed for its life and given
    here; each step comes as a `StepRun` (the slot, the values, the node loop)."""

    def __init__(self, plan: Any, graph: Any, backend: Any, options: Any, arrays: list,
                 input_symbols: Any, trace: StepTrace):
        self.plan, self.graph, self.backend = plan, graph, backend
        self.options, self.arrays = options, arrays
        self.input_symbols = input_symbols
        self.clock = getattr(self.backend, "host_clock", None)  # see `Backend.host_clock`
        self.build_growing = growing_symbols(graph)
        #: shape arithmetic a recording may bake where all of it is captured (`segment`)
        self.shape_derived = shape_derived_values(self.plan, graph.initializers)
        #: initializers some kernel reads on the host (a Range's constant delta beside a
        #: computed limit): constants, which a recording bakes with the rest
        self.host_constants = frozenset(
            p.inputs[i] for p in self.plan.nodes for i in p.capture.host_inputs
            if i < len(p.inputs) and p.inputs[i] in graph.initializers)
        self._constant_copies: dict[int, Any] = {}
        self.quarantined: set[tuple[str, str]] = set()
        #: (the declines list, what `branch_fields` says of it)
        self._seam_summary: tuple = (None, "")
        self.control_flow_outputs = {
            o for p in plan.nodes if p.node.subgraphs for o in p.outputs if o >= 0}
        #: the graph's feeds (a moved one is staged from the next capture on: `SlotCapture.moved_feeds`)
        self.feed_ids = frozenset(graph.inputs)
        #: where the capture tables' rows are written (`step_trace`)
        self.trace: StepTrace = trace

    # -- deciding ------------------------------------------------------------------

    def enabled_reason(self) -> str | None:
        """None when capture may run in this executor, else why not."""
        if not self.options.capture:
            return "capture is off (SessionOptions.capture / WORKBENCH_CAPTURE)"
        if not getattr(self.backend, "supports_capture", False):
            return f"the {self.backend.name} backend cannot capture"
        if self.options.release_dead_values:
            return "release_dead_values frees buffers between steps; captured graphs need stable addresses"
        return None

    def growing(self, memo: Any, bound: dict[int, Any]) -> set[str]:
        """Symbols whose ops stay eager: KV lengths and whatever the memo saw varying,
        minus KV axes pinned to a fixed capacity (past bound as its own present)."""
        symbols = set(self.build_growing)
        if memo is not None:
            symbols |= set(memo.varying)
        return symbols - self.pinned_symbols(bound)

    def pinned_symbols(self, bound: dict[int, Any]) -> set[str]:
        if not bound:
            return set()
        bound_addresses = {address(a) for a in bound.values()}
        pinned = set()
        for vid in self.graph.inputs:
            v = self.graph.values[vid]
            arr = self.arrays[vid]
            if v.shape and len(v.shape) == 4 and isinstance(v.shape[2], str) and arr is not None \
                    and address(arr) in bound_addresses:
                pinned.add(v.shape[2])
        return pinned

    def segment(self, step: StepRun, bound: dict[int, Any]) -> None:
        """Cut the plan into captured segments and seams. Shape arithmetic is baked in
        where every node computing it is captured (`shape_derived_values`): assumed of
        every candidate first, then withdrawn from each whose computation a seam holds,
        until what is assumed holds (each round only withdraws, so it ends)."""
        state = step.state
        cap = state.capture
        growing = self.growing(state.memo, bound)
        values = self.graph.values
        bound_ids = set(bound)
        folded = frozenset(step.baked)
        observed = cap.seen[1] if cap.seen is not None else ()
        copies = None if self.backend.capture_executes_work else cap.derived_host
        # the warm-up's copies are taken after its step: a value whose bytes a later node
        # overwrote in place (an ALIAS of the same owner) no longer holds its own value then
        overwritten = aliased_owners(state.storage) if copies is not None else frozenset()
        owner = state.storage.owner
        derived = {vid for vid in self.shape_derived
                   if vid not in cap.unbakeable and vid < len(observed) and small_enough_to_bake(observed[vid])
                   and (copies is None or (vid in copies and owner.get(vid, vid) not in overwritten))}
        while True:
            baked = folded | derived | self.host_constants
            declines: dict[int, CaptureDecline] = {}
            for d in state.dispatch:
                p = d.p
                preallocated = [o is not None for o in d.outs]
                decline = node_decline(p, preallocated, growing, bound_ids, self.quarantined, values, baked,
                                       cap.shape_changes, cap.limited, observed)
                if decline is not None:
                    declines[p.index] = decline
            segments, final = segment_plan(self.plan, declines, self.options.min_segment_nodes)
            captured = {k for seg in segments if seg.kind == "captured" for k in seg.nodes}
            holding = {vid for vid in derived if self.shape_derived[vid] <= captured}
            if holding == derived:
                break
            derived = holding
        cap.segments, cap.declines = segments, final
        cap.derived = frozenset(derived)
        self._keep_in_place(cap, state.dispatch, bound_ids)
        # a recording that computes (the CPU's launch list) can leave out what replays
        # would recompute to the same values; a device stream records every kernel
        cap.constant = constant_nodes(
            segments, self.plan, cap.derived, state.storage,
            set(self.graph.outputs) | bound_ids) if self.backend.capture_executes_work else frozenset()

    def _keep_in_place(self, cap: SlotCapture, dispatch: list, bound: set[int]) -> None:
        """Which inputs of the captured segments need a buffer of their own to keep their
        address: feeds that came at a new address each warm step (a plain `run` loop's
        fresh arrays), and values made just in time by a node outside the segments (a
        Range, an embedding Gather with a symbolic index shape, a host fallback's
        result). Everything else a segment reads is an initializer, a preallocated
        buffer or a caller-bound array, which keep their addresses while their shape
        holds."""
        plan, graph = self.plan, self.graph
        captured = [k for seg in cap.segments if seg.kind == "captured" for k in seg.nodes]
        inside = {o for k in captured for o in plan.nodes[k].outputs if o >= 0}
        reads = set()
        for seg in cap.segments:
            if seg.kind == "captured":
                reads.update(external_inputs(plan, seg.nodes))
        reads -= inside | set(graph.initializers) | bound
        inputs = set(graph.inputs)
        outputs = set(graph.outputs)  # handed to the caller (a growing present uncopied): never reused
        made_by = {vid: (d, j) for d in dispatch for j, vid in enumerate(d.p.outputs) if vid >= 0}
        kept, fed = set(), set()
        for vid in reads:
            # a segment reading a zero-copy view reads its source's buffer: keep the first
            # value up the chain that owns its bytes (a layout copy owns them too), or
            # stage the feed the chain starts from
            while vid in made_by:
                d, j = made_by[vid]
                if d.outs[j] is not None:
                    break  # preallocated: its buffer stays while its shape holds
                if vid not in outputs:
                    kept.add(vid)
                if not d.view or not d.p.inputs or d.p.inputs[0] < 0:
                    break
                vid = d.p.inputs[0]
            if vid in inputs and vid not in bound:
                fed.add(vid)
        seen = cap.seen[2] if cap.seen is not None else {}
        arrays = self.arrays
        cap.staged_feeds = tuple(vid for vid in sorted(fed) if hasattr(arrays[vid], "shape")
                                 and (cap.staging.get(vid) is arrays[vid] or vid in cap.moved_feeds
                                      or seen.get(vid) != address(arrays[vid])))
        cap.kept_values = frozenset(kept)

    def stage_feeds(self, cap: SlotCapture) -> None:
        """Copy each staged feed into its buffer and run on that (the caller's array is
        only read); a feed already there (IOBinding of the staging buffer) is left."""
        arrays = self.arrays
        backend = self.backend
        for vid in cap.staged_feeds:
            arr = arrays[vid]
            buf = cap.staging.get(vid)
            if arr is buf:
                continue
            if buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype:
                buf = cap.staging[vid] = backend.allocate(arr.shape, arr.dtype)
            buf[...] = arr
            arrays[vid] = buf

    def observe(self, cap: SlotCapture, bindings: dict[str, int]) -> None:
        """After an eager step: note every value's shape and every feed's address. Two
        comparable steps (the same symbols, none shrunk: the same decode regime) give the
        values whose shape moves (`varying_shape`); a prefill before a decode resets it."""
        arrays = self.arrays
        shapes = tuple(getattr(a, "shape", None) for a in arrays)
        feeds = {vid: address(arrays[vid]) for vid in self.graph.inputs if hasattr(arrays[vid], "shape")}  # (sequences: none)
        if not self.backend.capture_executes_work:  # what a recording there would bake
            to_host = self.backend.to_host
            cap.derived_host = {vid: to_host(arrays[vid]) for vid in self.shape_derived
                                if small_enough_to_bake(shapes[vid])}
        before = cap.seen
        # the regime is the inputs' symbols: just-in-time ones come and go with what ran
        regime = {s: n for s, n in bindings.items() if s in self.input_symbols}
        cap.seen = (regime, shapes, feeds)
        if before is None or before[0].keys() != regime.keys() \
                or any(regime[s] < n for s, n in before[0].items()):
            cap.shape_changes = {}
            return
        cap.shape_changes = {vid: (a, b) for vid, (a, b) in enumerate(zip(before[1], shapes))
                             if a != b and a is not None and b is not None}

    # -- running a step --------------------------------------------------------------

    def run_step(self, step: StepRun, steady: bool, bound: dict[int, Any], slot: str) -> str:
        """Run the step's nodes; returns the capture mode used: eager, capture or replay."""
        cap, run_nodes, rec, bindings = step.state.capture, step.run_nodes, step.rec, step.bindings
        disabled = self.enabled_reason()
        if disabled is not None:
            run_nodes(range(len(self.plan.nodes)))
            if rec is not None:
                self.trace.disabled(rec, slot, disabled)
            return "off"
        action = cap.next_action(steady, step.fold_pending)
        if action == "warm_up":
            cap.all_seams = False  # the plan may have changed: cut it again after this step
            if not steady and cap.installed:
                self._retire(cap, rec, slot, "buffers_reallocated", "the step re-planned its shapes")
            return self._warm_up(cap, run_nodes, rec, slot, bindings)
        if action == "eager":  # the same plan, cut before into seams only: nothing to record
            # (not `_finish_eagerly`: no recording reads what `observe` keeps before the next
            # warm-up, which observes its own step; and the rows keep the cut's seams)
            run_nodes(range(len(self.plan.nodes)))
            if rec is not None:
                self.trace.segments(rec, slot, cap, "eager")
            return "eager"
        if action == "capture":
            self.segment(step, bound)
            self.stage_feeds(cap)
            return self._capture(step, slot)
        self.stage_feeds(cap)
        return self._replay(step, slot)

    def _warm_up(self, cap: SlotCapture, run_nodes: Any, rec: Any, slot: str, bindings: dict[str, int]) -> str:
        run_nodes(range(len(self.plan.nodes)))
        cap.warm = True  # this eager run is the warm-up the next capture trusts
        self.observe(cap, bindings)
        if rec is not None:
            self.trace.segments(rec, slot, cap, "eager", whole_plan=True)
        return "eager"

    def _capture(self, step: StepRun, slot: str) -> str:
        cap, run_nodes, rec, bindings = step.state.capture, step.run_nodes, step.rec, step.bindings
        backend = self.backend
        arrays = self.arrays
        backend_graph = None
        baked = step.baked
        # id -> (array, host copy) a host read while recording may take as a constant: the
        # validated fold values, and shape arithmetic wholly captured (`segment`), added as
        # its arrays appear: at a segment's start (made earlier) and as each node makes them
        bakes = {id(arr): (arr, host) for arr, host in baked.values()}
        for vid in self.host_constants:
            arr = arrays[vid]
            copy = self._constant_copies.get(vid)
            if copy is None or copy[0] is not arr:
                copy = self._constant_copies[vid] = (arr, backend.to_host(arr))
            bakes[id(arr)] = copy
        copies = None if backend.capture_executes_work else cap.derived_host
        derived = cap.derived

        def bake(vid: int, arr: Any) -> None:
            if vid in derived and arr is not None:
                # a host backend's recording runs the chain: its own array holds this step's value
                bakes[id(arr)] = (arr, arr if copies is None else copies[vid])
        try:
            for seg in cap.segments:
                if seg.kind == "eager":
                    run_nodes(seg.nodes)
                    continue
                inputs = external_inputs(self.plan, seg.nodes)
                signature = binding_signature(arrays, inputs)
                t0 = time.perf_counter()
                known = set(bindings)
                if copies is not None and derived:
                    moved = self._moved_since_warm_up(cap, inputs)
                    if moved is not None:  # the warm-up's copies would be stale: record another step
                        self._abort(backend, None, cap)
                        return self._eager_instead(cap, run_nodes, rec, slot, bindings, "stale_bake", moved)
                for vid in inputs:
                    bake(vid, arrays[vid])
                graph = backend_graph = backend.begin_capture()
                label = f"segment {seg.index}"
                recorder = LaunchRecorder(backend, graph, bake if derived else None, cap.constant)
                with recording_launches(label, bakes):
                    run_nodes(seg.nodes, recorder)
                graph = backend.end_capture(graph)
                backend_graph = None
                if not backend.capture_executes_work:  # the capture rule above: run what was recorded
                    backend.launch(graph)
                    stale = self._stale_bakes(cap, seg)
                    if stale:
                        self._abort(backend, None, cap)
                        cap.unbakeable.update(stale)
                        names = ", ".join(repr(self.graph.values[v].name) for v in stale[:3])
                        return self._eager_instead(
                            cap, run_nodes, rec, slot, bindings, "stale_bake",
                            f"{names} differed once launched from the warm-up step's value; "
                            "its readers stay seams in this slot")
                outputs = {o: arrays[o] for k in seg.nodes for o in self.plan.nodes[k].outputs if o >= 0}
                buffers = [(k, j, o) for k in seg.nodes for j, o in enumerate(step.state.dispatch[k].outs)
                           if o is not None]
                planned = step.state.storage.owner
                owners = {vid: owner for vid in outputs
                          if (owner := step.owner_of(vid)) != planned.get(vid, vid)}
                observed = step.observed
                views = tuple((vid, *observed[vid][1:], k) for k in seg.nodes
                              for vid in self.plan.nodes[k].outputs if vid in observed)
                revealed = {s: n for s, n in bindings.items() if s not in known}
                cap.graphs[seg.index] = CapturedGraph(graph, signature, outputs, time.perf_counter() - t0,
                                                      buffers, owners=owners, views=views, symbols=revealed,
                                                      launched_nodes=tuple(recorder.launched))
                if rec is not None:
                    StepTrace.captured(rec, slot, seg.index, time.perf_counter() - t0,
                                       sum(k in cap.constant for k in seg.nodes))
        except CaptureViolation as violation:
            # a kernel read the host while recording: keep exactly that node's op eager
            self._abort(backend, backend_graph, cap)
            failed = self.plan.nodes[violation.plan_index].node
            self.quarantined.add((failed.domain, failed.op_type))
            if rec is not None:
                StepTrace.quarantined(rec, slot, f"{failed.op_type} ({failed.name}): {violation}")
            return self._eager_instead(cap, run_nodes, rec, slot, bindings, "capture_failed", str(violation))
        except KernelError as error:  # a genuine kernel bug: it names its node, and the step fails
            self._abort(backend, backend_graph, cap)
            StepTrace.retired(rec, slot, "kernel_error", str(error))
            raise
        except MechanismDivergenceError:  # shadow="raise" in a seam's subgraph: the finding, not a capture failure
            self._abort(backend, backend_graph, cap)
            raise
        except Exception as error:  # noqa: BLE001 - begin/end_capture or the driver refused
            self._abort(backend, backend_graph, cap)
            return self._eager_instead(cap, run_nodes, rec, slot, bindings, "capture_api_error",
                                       f"{type(error).__name__}: {error}")
        cap.captures += 1
        cap.all_seams = not cap.graphs
        if rec is not None:
            self.trace.baked(rec, slot, cap, baked, self.host_constants)
            self.trace.segments(rec, slot, cap, "captured")
            self.trace.declines(rec, slot, cap)
        return "capture"

    def _replay(self, step: StepRun, slot: str) -> str:
        state = step.state
        cap, run_nodes, rec, bindings = state.capture, step.run_nodes, step.rec, step.bindings
        arrays = self.arrays
        replayed = []
        events: list = []  # the replay rows' fields, one segment after another (`StepTrace.replay_events`)
        node_log = rec.node_log() if rec is not None else None  # each segment's node rows, without a call
        clock = self.clock
        for pos, seg in enumerate(cap.segments):
            if seg.kind == "eager":
                run_nodes(seg.nodes)
                continue
            captured = cap.graphs[seg.index]
            why = captured.mismatch(arrays, state.dispatch, self.graph, state.bound_positions, self.control_flow_outputs)
            if why is not None:
                for installed in cap.graphs.values():  # (the later segments' feeds too: one retire for them all)
                    cap.moved_feeds |= installed.moved(arrays, self.feed_ids)
                self._replayed_views(cap, replayed, step)
                StepTrace.replay_events(rec, events)
                return self._rest_eagerly(cap, pos, run_nodes, rec, slot, bindings, *why)
            if rec is not None:  # a host backend's clock read directly, as for an eager node
                timer = clock() if clock is not None else self.backend.start_timer()
            t0 = time.perf_counter()
            try:
                captured.replay(self.backend, arrays, bindings)
            except Exception as error:  # noqa: BLE001 - the launch failed: redo this and the rest eagerly
                self._replayed_views(cap, replayed, step)
                StepTrace.replay_events(rec, events)
                return self._rest_eagerly(cap, pos, run_nodes, rec, slot, bindings, "capture_api_error",
                                          f"launch: {type(error).__name__}: {error}")
            step.replayed_s += time.perf_counter() - t0
            for vid, owner in captured.owners.items():  # what the recorded launches copied
                step.set_owner(vid, owner)
            replayed.append(captured)
            step.replayed_nodes.extend(seg.nodes)
            if rec is not None:
                duration = clock() - timer if clock is not None else self.backend.stop_timer(timer)  # device time
                node_log += (seg.nodes, "replayed", duration)  # a span: `Recording.node_span`
                events += (slot, seg.index, "replay", "binding signature unchanged", duration)
        cap.replays += 1
        self._replayed_views(cap, replayed, step)
        if rec is not None:
            StepTrace.replay_events(rec, events)
            self.trace.segments(rec, slot, cap, "replayed")
        return "replay"

    def branch_fields(self, step: StepRun) -> tuple:
        """`step`, the last run of this (If branch's) executor, as its `branch_capture`
        row gives it after the If's: nodes, nodes replayed and the host µs replaying
        them, the slot's captures, replays and retires so far, its seams by reason, and
        the µs its eager nodes' kernels took (timed where the step kept a node log)."""
        cap = step.state.capture
        declines, seams = self._seam_summary
        if declines is not cap.declines:
            counts: dict[str, int] = {}
            for d in cap.declines:
                counts[d.reason] = counts.get(d.reason, 0) + 1
            seams = ", ".join(f"{reason} x{n}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            self._seam_summary = (cap.declines, seams)
        log = step.node_log
        eager_s = sum(log[2::3]) if log is not None and step.rec is None else float("nan")
        return (len(self.plan.nodes), len(step.replayed_nodes), step.replayed_s * 1e6,
                cap.captures, cap.replays, cap.retires, seams, eager_s * 1e6)

    @staticmethod
    def replay_restores(cap: SlotCapture) -> frozenset:
        """The values whose arrays a full replay of `cap`'s installed graphs sets: the
        very arrays each graph recorded into, every replay of the same graphs. One
        frozenset for as long as those graphs stay installed (a new capture or a retire
        makes another), so a caller can tell a replay of the same graphs by identity."""
        key = (cap.captures, cap.retires)
        kept = cap.replay_outputs
        if kept is None or kept[0] != key:
            kept = cap.replay_outputs = (key, frozenset(vid for g in cap.graphs.values() for vid in g.outputs))
        return kept[1]

    def _replayed_views(self, cap: SlotCapture, replayed: list[CapturedGraph], step: StepRun) -> None:
        """The zero-copy views the replayed segments restored, at once: each pins its
        owner, and the trace gets the pin and view rows an eager step would give. Worked
        out once for as long as the same graphs replay (`SlotCapture.replayed_views`)."""
        key = (cap.captures, cap.retires, len(replayed))
        kept = cap.replayed_views
        if kept is None or kept[0] != key:
            views = tuple(view for captured in replayed for view in captured.views)
            first: dict[int, int] = {}
            for view in views:
                first.setdefault(view[1], view[-1])
            kept = cap.replayed_views = (key, views, tuple(("pin", owner, 0, k) for owner, k in first.items()),
                                         frozenset(first))
        if kept[1]:
            step.restore_views(*kept[1:])

    def _retire(self, cap: SlotCapture, rec: Any, slot: str, reason: str, detail: str, segment: int = -1) -> None:
        cap.retire()
        StepTrace.retired(rec, slot, reason, detail, segment)

    @staticmethod
    def _abort(backend: Any, backend_graph: Any, cap: SlotCapture) -> None:
        """Abandon a recording part-way: nothing of it is installed."""
        if backend_graph is not None:
            backend.abort_capture(backend_graph)
        cap.retire()

    def _eager_instead(self, cap: SlotCapture, run_nodes: Any, rec: Any, slot: str, bindings: dict[str, int],
                       reason: str, detail: str) -> str:
        """The recording failed: log why, and complete the step eagerly."""
        StepTrace.retired(rec, slot, reason, detail)
        return self._finish_eagerly(cap, range(len(self.plan.nodes)), run_nodes, rec, slot, bindings)

    def _rest_eagerly(self, cap: SlotCapture, pos: int, run_nodes: Any, rec: Any, slot: str,
                      bindings: dict[str, int], reason: str, detail: str) -> str:
        """A replay cannot go on at segment `pos`: retire, and run it and the rest eagerly.
        The segment's retires for this reason are counted; at `capture_rerecord_limit`
        its nodes are seams for good, with a decline naming the reason and the count."""
        seg = cap.segments[pos]
        self._count_retire(cap, seg, reason, detail)
        self._retire(cap, rec, slot, reason, detail, seg.index)
        rest = [k for seg in cap.segments[pos:] for k in seg.nodes]
        return self._finish_eagerly(cap, rest, run_nodes, rec, slot, bindings)

    def _count_retire(self, cap: SlotCapture, seg: Any, reason: str, detail: str) -> None:
        limit = self.options.capture_rerecord_limit
        # the same reason: the same value and what changed of it, whatever its new shape
        key = (seg.first, seg.last, reason, " ".join(detail.split()[:2]))
        count = cap.retire_counts[key] = cap.retire_counts.get(key, 0) + 1
        if limit and count >= limit:
            why = f"retired {count} times for {reason}: {detail}"
            for k in seg.nodes:
                cap.limited[k] = CaptureDecline(k, "rerecord_limit", why)

    def _finish_eagerly(self, cap: SlotCapture, nodes: Any, run_nodes: Any, rec: Any, slot: str,
                        bindings: dict[str, int]) -> str:
        run_nodes(nodes)
        self.observe(cap, bindings)
        if rec is not None:
            self.trace.segments(rec, slot, cap, "eager", whole_plan=True)
        return "eager"

    # -- checking bakes ------------------------------------------------------------------

    def _moved_since_warm_up(self, cap: SlotCapture, inputs: list[int]) -> str | None:
        """Why the warm-up step's host copies of shape arithmetic may not be baked into
        this recording (an input of the segment has another shape than then), or None.
        Inside captured segments every shape follows from their inputs' shapes, so the
        same input shapes give the same shape arithmetic as the warm-up step computed."""
        seen = cap.seen[1]
        arrays = self.arrays
        for vid in inputs:
            shape = getattr(arrays[vid], "shape", None)
            if shape is not None and vid < len(seen) and seen[vid] is not None and shape != seen[vid]:
                return (f"{self.graph.values[vid].name!r} has shape {tuple(shape)}, the warm-up step's was "
                        f"{tuple(seen[vid])}: the shape arithmetic recorded from it would be stale")
        return None

    def _stale_bakes(self, cap: SlotCapture, seg: Any) -> list[int]:
        """The shape-derived values segment `seg` computes whose launched value is not the
        host copy its recording baked (a backend whose recording computes nothing)."""
        to_host, copies, arrays = self.backend.to_host, cap.derived_host, self.arrays
        made = [o for k in seg.nodes for o in self.plan.nodes[k].outputs if o in cap.derived]
        return [vid for vid in made if not np.array_equal(to_host(arrays[vid]), copies[vid])]

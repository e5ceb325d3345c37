"""Every trace row the executor writes, in one place: `StepTrace`.

The executor, its capture runner and the memo steps decide; what each step did goes
to the Recording through here: the memo row, the liveness rows (`liveness_rows`), the
io_buffers rows (`io_rows`), an If branch's branch_capture row, the shadow check's
rows and the capture tables (segments, events, declines). The generic tables'
columns are `workbench.tables`'.

These run every traced decode step, so each writes with the one Recording call the
step needs and hands again the rows it made last time while what they were made from
is unchanged (the caches below live as long as the executor). Nothing here runs per
node: node rows go onto the Recording's node log in dispatch.
"""

from __future__ import annotations

from typing import Any

from ..tables import (
    BRANCH_CAPTURE_COLUMNS,
    CAPTURE_EVENTS_COLUMNS,
    CAPTURE_SEGMENTS_COLUMNS,
    DIVERGENCES_COLUMNS,
    IO_BUFFERS_COLUMNS,
    MEMO_COLUMNS,
    SHADOW_COLUMNS,
)
from .capture import SlotCapture, reads_only_baked
from .io_rows import IoRows, io_layout
from .liveness_rows import LivenessRows
from .views import KnownAddresses


class StepTrace:
    """The rows of one executor's steps, and what they keep from step to step."""

    def __init__(self, plan: Any, graph: Any, addresses: KnownAddresses) -> None:
        self.plan, self.graph, self.addresses = plan, graph, addresses
        #: slot name -> the last liveness rows emitted for it and what they were made from
        self.liveness_rows: dict[str, LivenessRows] = {}
        #: what liveness rows need not re-read each step: all but layout nodes' outputs
        #: keep the storage plan's owner; initializers keep their arrays
        self._view_vids = tuple(o for p in plan.nodes if p.spec.produces_view for o in p.outputs if o >= 0)
        self._fixed_vids = frozenset(graph.initializers) - set(graph.inputs)
        #: the graph outputs not bound by the caller, per (ordered) set of bound outputs
        self._unbound_outputs: dict[tuple, tuple[int, ...]] = {}
        #: the last step's io_buffers block (handed again while its numbers hold); the
        #: (value, role) positions per set of feeds and bound outputs
        self.io_rows = IoRows()
        self._io_layouts: dict[tuple, tuple] = {}
        #: (memo, its varying set, the memo row's fields of them) for `memo`
        self.memo_summary: tuple | None = None
        #: id of an If branch's graph -> (the If's plan index, node name, branch name)
        self._branch_nodes: dict[int, tuple] = {}
        #: (slot, state, whole plan) -> (the segments, their rows, the plan's length)
        self.segment_rows: dict[tuple, tuple[Any, tuple, int]] = {}

    # -- every step ----------------------------------------------------------------------

    def memo(self, rec: Any, state: Any, stage2: str, phase: str, slot: str, action: str, reason: str,
             resolve_s: float, elided: int, views_reused: int) -> None:
        """The step's memo row: `state` is the slot's (`SlotState`), `stage2` the view plan's state."""
        memo = state.memo
        varying = memo.varying if memo is not None else None
        summary = self.memo_summary
        if summary is None or summary[0] is not memo or summary[1] is not varying:
            # the memo's own fields, worked out once per memo (a new memo is a new object;
            # the check on `varying` catches that set replaced on the same memo)
            fields = ([], 0, 0) if memo is None else (sorted(varying), len(memo.invariant), len(memo.variant))
            summary = self.memo_summary = (memo, varying, fields)
        rec.add_flat_rows("memo", MEMO_COLUMNS, (
            slot, phase, action, reason, *summary[2], resolve_s * 1e3,
            stage2, views_reused, elided, state.stage2_streak))

    def liveness(self, rec: Any, state: Any, arrays: list, owners: dict[int, int], released: dict[int, int],
                 pinned: set[int], replayed: frozenset | None) -> None:
        """One row per value of the slot's storage plan (see `liveness_rows`); `replayed`:
        the values a replay of the installed graphs restored (None: not a replay)."""
        sp = state.storage
        rows = self.liveness_rows.get(state.name)
        if rows is None or rows.storage is not sp:
            rows = self.liveness_rows[state.name] = LivenessRows(sp, self._view_vids, self._fixed_vids)
        rows.emit(rec, arrays, owners, state.buffers, released, pinned, replayed)

    def io_buffers(self, rec: Any, feeds: dict[int, Any], bound: dict[int, Any], arrays: list) -> None:
        """Where this step's caller-facing arrays live: every feed, bound output and graph
        output, with the buffer underneath (a KV past may be a view of a bigger cache),
        so reports can tell a cache that moved or was copied from one grown in place."""
        key = tuple(bound)
        outputs = self._unbound_outputs.get(key)
        if outputs is None:
            outputs = self._unbound_outputs[key] = tuple(v for v in self.graph.outputs if v not in bound)
        layout = self._io_layouts.get((tuple(feeds), key))
        if layout is None:
            layout = self._io_layouts[(tuple(feeds), key)] = io_layout(feeds, bound, outputs)
        facing = (*feeds.values(), *bound.values(), *map(arrays.__getitem__, outputs))
        rec.add_rows("io_buffers", IO_BUFFERS_COLUMNS, self.io_rows.block(layout, facing, self.addresses))

    def branch(self, rec: Any, slot: str, graph: Any, fields: tuple) -> None:
        """A `branch_capture` row for the If branch `graph` just run: what its captured
        segments replayed (`fields`: `CaptureRunner.branch_fields`), which reports fold
        into the If's own time."""
        where = self._branch_nodes.get(id(graph))
        if where is None:
            plan = self.plan
            k = next(p.index for p in plan.nodes if any(g is graph for g in p.node.subgraphs.values()))
            where = self._branch_nodes[id(graph)] = (k, plan.nodes[k].node.name, graph.name)
        rec.add_flat_rows("branch_capture", BRANCH_CAPTURE_COLUMNS, (slot, *where, *fields))

    @staticmethod
    def shadow(rec: Any, slot: str, found: list, mechanisms: list[str]) -> None:
        """A shadowed step's row, and one per divergent value found."""
        rec.add_rows("shadow", SHADOW_COLUMNS, ((slot, True, len(found), mechanisms),))
        if found:
            rec.add_rows("divergences", DIVERGENCES_COLUMNS, tuple(
                (slot, d.plan_index, d.node, d.op_type, d.value, d.mechanism, d.max_abs_err,
                 list(d.shape_expected or ()), list(d.shape_got or ())) for d in found))

    # -- capture -------------------------------------------------------------------------

    def segments(self, rec: Any, slot: str, cap: SlotCapture, state: str, whole_plan: bool = False) -> None:
        """The step's segment rows; the same every step the segments and state are."""
        plan = self.plan
        whole_plan = whole_plan or not cap.segments
        key = (slot, state, whole_plan)
        cached = self.segment_rows.get(key)
        if cached is not None and cached[0] is cap.segments and (not whole_plan or cached[2] == len(plan.nodes)):
            rec.add_rows("capture_segments", CAPTURE_SEGMENTS_COLUMNS, cached[1])
            return
        if whole_plan:
            n = len(plan.nodes)
            rows = ((slot, 0, 0, n - 1, n, "eager", "eager"),)
        else:
            rows = tuple((slot, seg.index, seg.first, seg.last, len(seg.nodes), seg.kind,
                          state if seg.kind == "captured" else "eager") for seg in cap.segments)
        # segments are made whole by `segment_plan` and replaced, never edited, afterwards
        self.segment_rows[key] = (cap.segments, rows, len(plan.nodes))
        rec.add_rows("capture_segments", CAPTURE_SEGMENTS_COLUMNS, rows)

    @staticmethod
    def replay_events(rec: Any, events: list) -> None:
        """A step's capture_events replay rows, one per segment replayed (their fields one
        after another in `events`), as one block: the rows of one `add_row` call each,
        after the step's replayed node rows."""
        if rec is not None and events:
            rec.add_flat_rows("capture_events", CAPTURE_EVENTS_COLUMNS, tuple(events))

    @staticmethod
    def captured(rec: Any, slot: str, segment: int, duration_s: float, constant: int = 0) -> None:
        """Segment `segment` was recorded, in `duration_s`; `constant` of its nodes are
        shape arithmetic its replays do not launch again (`capture.constant_nodes`)."""
        reason = "warm step seen; recording"
        if constant:
            reason += (f" ({constant} shape-arithmetic node{'s' if constant > 1 else ''} fixed by the input "
                       "shapes each replay checks: recorded once, not launched again)")
        rec.add_row("capture_events", slot=slot, segment=segment, event="capture",
                    reason=reason, duration_s=duration_s)

    @staticmethod
    def quarantined(rec: Any, slot: str, why: str) -> None:
        """An op type was quarantined: a kernel of it read the host while recording."""
        rec.add_row("capture_events", slot=slot, segment=-1, event="quarantine", reason=why, duration_s=0.0)

    @staticmethod
    def retired(rec: Any, slot: str, reason: str, detail: str, segment: int = -1) -> None:
        """A retire row: `segment` is the one whose check failed (-1: the whole slot's
        graphs, for a reason no single segment caused)."""
        if rec is not None:
            rec.add_row("capture_events", slot=slot, segment=segment, event="retire",
                        reason=f"{reason}: {detail}", duration_s=0.0)

    def baked(self, rec: Any, slot: str, cap: SlotCapture, baked: dict[int, tuple],
              host_constants: frozenset) -> None:
        """A capture_events row for each captured node that reads baked values on the host."""
        plan, values = self.plan, self.graph.values
        folded = frozenset(baked)
        every = folded | cap.derived | host_constants
        rows = []
        for seg in cap.segments:
            if seg.kind != "captured":
                continue
            for k in seg.nodes:
                p = plan.nodes[k]
                if not p.capture.supported and reads_only_baked(p, every):
                    read = [p.inputs[i] for i in p.capture.host_inputs if i < len(p.inputs) and p.inputs[i] >= 0]
                    what = ("validated shape-fold values, the same at every replay"
                            if all(v in folded or v in host_constants for v in read)
                            else "shape arithmetic computed inside the captured segments, fixed by the "
                                 "input shapes every replay checks")
                    rows.append((slot, seg.index, "bake",
                                 f"{p.node.op_type} ({p.node.name}) reads "
                                 f"{', '.join(values[v].name for v in read)} on the host: {what}, taken as constants",
                                 0.0))
        if rows:
            rec.add_rows("capture_events", CAPTURE_EVENTS_COLUMNS, tuple(rows))

    def declines(self, rec: Any, slot: str, cap: SlotCapture) -> None:
        """A capture_declines row for each node kept out of the captured segments."""
        plan = self.plan
        segment_of = {k: seg.index for seg in cap.segments for k in seg.nodes}
        for d in cap.declines:
            node = plan.nodes[d.plan_index].node
            rec.add_row("capture_declines", slot=slot, segment=segment_of.get(d.plan_index, -1),
                        plan_index=d.plan_index, node=node.name, op_type=node.op_type, domain=node.domain,
                        reason=d.reason, detail=d.detail, symbols=list(d.symbols))

    def disabled(self, rec: Any, slot: str, why: str) -> None:
        """Capture is off: the whole plan one eager segment, and one decline saying why."""
        n = len(self.plan.nodes)
        rec.add_row("capture_segments", slot=slot, segment=0, first_node=0, last_node=n - 1,
                    node_count=n, kind="eager", state="eager")
        rec.add_row("capture_declines", slot=slot, segment=0, plan_index=-1, node="", op_type="",
                    domain="", reason="capture_disabled", detail=why, symbols=[])


__all__ = ["StepTrace"]

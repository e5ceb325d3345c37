"""Segmented device-graph capture: which nodes fold into captured segments, and why
every other node is an eager seam.

Each step, per slot, the plan is cut into maximal runs of capturable nodes
(captured segments) separated by eager seams. Every node that is not captured
carries a `CaptureDecline` with a reason code from `DECLINE_REASONS`. A slot's
graphs are recorded once (after an eager warm-up step) and replayed while the
binding signature of each segment's external inputs is unchanged.
"""

from __future__ import annotations

import operator
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..addresses import address, holds_now
from ..ops.registry import fixed_arrays_kernel
from ..reasons import DECLINE_REASONS, RETIRE_REASONS  # noqa: F401 - RETIRE_REASONS re-exported
from .memo import SHAPE_ARITHMETIC, SHAPE_FOLD_MAX_ELEMENTS, SHAPE_SOURCES
from .shapes import symbols_in
from .storage import ALIAS
from .views import is_view_of

_KV_NAME = re.compile(r"^(past|present)", re.IGNORECASE)


@dataclass(frozen=True)
class CaptureDecline:
    plan_index: int
    reason: str
    detail: str
    symbols: tuple[str, ...] = ()


@dataclass
class Segment:
    index: int
    kind: str  # "captured" | "eager"
    #: plan indices, consecutive (a tuple: the trace keeps it as given for every replay's node rows)
    nodes: tuple[int, ...]

    @property
    def first(self) -> int:
        return self.nodes[0]

    @property
    def last(self) -> int:
        return self.nodes[-1]


@dataclass
class CapturedGraph:
    """One recorded segment: the backend's graph and what it was recorded against."""

    graph: Any
    #: (value id, dtype, shape, strides, address) of every external input, at capture time
    signature: tuple
    #: value id -> array of every value the segment defines (restored into the executor's arrays on replay)
    outputs: dict[int, Any]
    duration_s: float = 0.0
    #: (plan index, output position, buffer) the launches write into: must still be current
    buffers: list = field(default_factory=list)
    #: (the dispatch list, its nodes' output lists, positions, buffers) of the last check passed
    _checked: tuple | None = field(default=None, repr=False)
    #: value id -> owner, for each value the segment defines whose owner is not the
    #: storage plan's (a layout node that had to copy): every replay restores it
    owners: dict[int, int] = field(default_factory=dict)
    #: (value, owner, shape, strides, byte offset, plan index) of each zero-copy view the
    #: segment defines, as recorded: every replay restores the view, which pins its owner
    views: tuple = ()
    #: the just-in-time symbols the recorded nodes bound (their outputs' sizes): a replay
    #: binds them again, as running the nodes would, for the dims later nodes resolve
    symbols: dict = field(default_factory=dict)
    #: plan indices of the nodes whose launches the recording holds (`LaunchRecorder.launched`)
    launched_nodes: tuple = ()
    #: the inputs the last passing check saw, kept to tell them again cheaply (`_same_binding`)
    _seen: tuple | None = field(default=None, repr=False)

    # -- the lifecycle: check, replay, free ------------------------------------------------

    def mismatch(self, arrays: list, dispatch: list, graph: Any, bound_positions: dict,
                 control_flow_outputs: set[int]) -> tuple[str, str] | None:
        """Why this graph cannot replay on the values `arrays` holds now, as (retire reason,
        detail), or None: an input moved, changed shape, strides or dtype since the
        recording, or a node of the segment has another output buffer than it wrote."""
        if not self._same_binding(arrays, graph.initializers):
            now = binding_signature(arrays, [entry[0] for entry in self.signature])
            if now != self.signature:
                return describe_change(graph, self.signature, now, control_flow_outputs)
        if self.buffers_current(dispatch):
            return None
        for k, j, arr in self.buffers:
            if dispatch[k].outs[j] is not arr:
                vid = dispatch[k].p.outputs[j]
                name = graph.values[vid].name
                if vid in bound_positions:
                    return "binding_changed", f"{name} address (caller-bound output)"
                return "buffers_reallocated", f"{name} has a new buffer"
        return None

    def moved(self, arrays: list, candidates: Any) -> set[int]:
        """Those of `candidates` (value ids) this graph reads that are now at another
        address than at the recording, with the same shape and dtype."""
        return {vid for vid, dtype, shape, _, addr in self.signature
                if vid in candidates and hasattr(arrays[vid], "nbytes") and arrays[vid].shape == shape
                and arrays[vid].dtype.str == dtype and address(arrays[vid]) != addr}

    def replay(self, backend: Any, arrays: list, bindings: dict[str, int]) -> None:
        """Launch the recorded work and put what it wrote back into `arrays`, and the sizes
        it revealed into `bindings` (fixed by the input shapes `mismatch` checked)."""
        backend.launch(self.graph)
        for vid, arr in self.outputs.items():
            arrays[vid] = arr
        bindings.update(self.symbols)

    def free(self) -> None:
        """Let go of the backend graph and the buffers it addresses (its pool with them)."""
        self.graph, self.outputs, self.buffers, self._checked, self._seen = None, {}, [], None, None

    def _same_binding(self, arrays: list, initializers: Any) -> bool:
        """True when every input is as `binding_signature` recorded it at capture time
        (dtype, shape, strides, address); False sends the check to the full comparison.

        After a check passes, the very objects it saw are kept (weakly) with their dtype
        objects: the next step an input that is the same object, with the same dtype
        object, shape and strides, is as it was (same size, so not moved; see
        `KnownAddresses`); any other input has its address read. Initializers (most of
        a segment's inputs: its weights) are the executor's own arrays for its whole
        life, never reshaped: they are kept strongly and checked by identity alone, so
        a step whose live inputs are new objects (a view an eager Reshape makes anew
        each step, at the same address) reads only those."""
        seen = self._seen
        if seen is not None:
            live, same_initializers = seen
            if same_initializers(arrays):
                for ref, dtype, (vid, _, shape, strides, _) in live:
                    a = arrays[vid]
                    if a is not ref() or a.dtype is not dtype or a.shape != shape or a.strides != strides:
                        return self._live_as_recorded(arrays, [entry for _, _, entry in live], same_initializers)
                return True
        self._seen = None
        live, fixed = [], []
        for entry in self.signature:
            if not _as_recorded(arrays[entry[0]], entry):
                return False
            if entry[0] in initializers:
                fixed.append(entry[0])
            else:
                live.append(entry)
        self._keep_seen(arrays, live, holds_now(arrays, fixed))
        return True

    def _live_as_recorded(self, arrays: list, live: list, same_initializers: Any) -> bool:
        """`_same_binding` once the initializers held by identity: each live input
        (signature entries) read in full against the recording."""
        if not all(_as_recorded(arrays[entry[0]], entry) for entry in live):
            self._seen = None
            return False
        self._keep_seen(arrays, live, same_initializers)
        return True

    def _keep_seen(self, arrays: list, live: list, same_initializers: Any) -> None:
        """Keep, weakly, the live inputs' objects just found as recorded, with their dtype
        objects, for the next step's check by identity; where one takes no weak
        reference, every step checks in full."""
        try:
            self._seen = ([(weakref.ref(arrays[entry[0]]), arrays[entry[0]].dtype, entry) for entry in live],
                          same_initializers)
        except TypeError:
            self._seen = None

    def buffers_current(self, dispatch: list) -> bool:
        """Whether every node of `dispatch` still writes where the launches do. The
        output lists are fetched once per dispatch list (a re-plan makes a new one)
        and then compared in one pass."""
        checked = self._checked
        if checked is None or checked[0] is not dispatch:
            if not self.buffers:
                return True
            ks, js, recorded = zip(*self.buffers)
            checked = self._checked = (dispatch, [dispatch[k].outs for k in ks], js, recorded)
        _, outputs, js, recorded = checked
        return all(map(operator.is_, map(operator.getitem, outputs, js), recorded))


@dataclass
class SlotCapture:
    """Capture bookkeeping of one slot (primary decode or speculative verify)."""

    segments: list[Segment] = field(default_factory=list)
    declines: list[CaptureDecline] = field(default_factory=list)
    graphs: dict[int, CapturedGraph] = field(default_factory=dict)  # segment index -> graph
    warm: bool = False  # an eager step with this plan has run (its shapes seed the capture)
    #: the last cut of this plan captured no segment (every node a seam): steady steps run
    #: it eagerly without cutting it again, until the plan changes (a warm-up step)
    all_seams: bool = False
    captures: int = 0
    replays: int = 0
    retires: int = 0
    #: ((captures, retires, segments replayed), views, pin rows, owners) of the last
    #: replay's zero-copy views (`CaptureRunner._replayed_views`)
    replayed_views: tuple | None = None
    #: ((captures, retires), value ids) of what a replay of the installed graphs
    #: restores (`CaptureRunner.replay_restores`)
    replay_outputs: tuple | None = None
    # -- what the warm-up steps showed, and what keeps the graphs' inputs in place --------
    #: (bindings, each value's shape, each graph input's address) at the last eager step
    seen: tuple | None = None
    #: value id -> (shape before, shape now) of the values whose shape moved between the
    #: last two comparable eager steps (`varying_shape` declines)
    shape_changes: dict = field(default_factory=dict)
    #: feeds a captured segment reads that arrived at a new address each warm step, or
    #: once under an installed graph (`moved_feeds`): copied into `staging` (one buffer
    #: each, the graphs read it) before every step
    staged_feeds: tuple = ()
    staging: dict = field(default_factory=dict)
    #: feeds that came at another address than a recording read them at (a new
    #: Generator's staged inputs, a caller's new array): staged at every later capture,
    #: so the next graphs do not retire for it again
    moved_feeds: set = field(default_factory=set)
    #: values made just in time outside the captured segments and read inside one: the
    #: producer's fresh result is copied into `kept` (one buffer each, address fixed)
    kept_values: frozenset = frozenset()
    kept: dict = field(default_factory=dict)
    #: (first node, last node, reason, detail) of a segment -> times retired for it
    retire_counts: dict = field(default_factory=dict)
    #: plan index -> the rerecord_limit decline its segment earned (never captured again)
    limited: dict = field(default_factory=dict)
    # -- shape arithmetic the recordings bake in (`CaptureRunner.segment`) ----------------
    #: the shape-derived values whose whole computation lies in captured segments: their
    #: readers' host reads are taken as constants while recording
    derived: frozenset = frozenset()
    #: value id -> its host copy at the last eager step, on a backend whose recording
    #: computes nothing (CUDA): what a recording bakes, checked once launched
    derived_host: dict = field(default_factory=dict)
    #: plan indices of captured nodes whose launches a replay skips (`constant_nodes`)
    constant: frozenset = frozenset()
    #: shape-derived values found to differ between a warm-up step and the capture
    #: (`stale_bake`): never baked again in this slot
    unbakeable: set = field(default_factory=set)

    @property
    def installed(self) -> bool:
        return bool(self.graphs)

    def next_action(self, steady: bool, fold_pending: bool) -> str:
        """The slot's lifecycle as a counter of what it has seen, like tinygrad's
        TinyJit: "warm_up" (run eagerly: a re-planned step, no eager step with this
        plan yet, or a shape fold still to be checked, which a recording a step later
        can bake), then "capture" (record each captured segment), then "replay" until
        a retire sends it back to warming up; or "eager" while the plan's last cut captured
        nothing (`all_seams`)."""
        if not steady or not self.installed and (not self.warm or fold_pending):
            return "warm_up"
        if self.all_seams:
            return "eager"
        return "replay" if self.installed else "capture"

    def retire(self) -> None:
        for captured in self.graphs.values():
            captured.free()
        self.graphs.clear()
        self.warm = False
        self.retires += 1


class LaunchRecorder:
    """What dispatch tells a segment being recorded, once per node: the one hook the
    capture has in the node loop. A backend whose stream records (CUDA) has the
    kernels' launches already and notes nothing; the CPU backend records each node as
    the launch its replay repeats, with the very arrays it ran on."""

    def __init__(self, backend: Any, graph: Any, bake: Any = None, constant: frozenset = frozenset()):
        self.backend = backend
        self.graph = graph
        #: plan indices whose work a replay need not repeat (`constant_nodes`): not recorded
        self.constant = constant
        #: plan index of each recorded launch, in order (-1: a contiguity copy)
        self.launched: list[int] = []
        #: called with each output a node made (value id, array): a shape-derived value
        #: joins what later host reads of this recording may bake (`CaptureRunner._capture`)
        self.bake = bake

    def copied(self, source: Any, copy: Any) -> None:
        """A contiguity copy the node's inputs needed: a launch of its own."""
        self.backend.record(self.graph, copy_launch, [source], [copy])
        self.launched.append(-1)

    def dispatched(self, d: Any, ins: list, outs: list, arrays: list, owners: dict[int, int]) -> None:
        """Node `d` ran on `ins` into `outs`; `arrays` holds what it produced. What a replay
        must redo: every write into a buffer, a copy a layout node made (into the array
        this run produced) or an output created just in time included. A pure zero-copy
        view is no work: its replay is the view itself."""
        written = list(outs)
        for j, vid in enumerate(d.p.outputs):
            if vid < 0 or outs[j] is not None:
                continue
            arr = arrays[vid]
            made = owners.get(vid) == vid if d.view else not any(
                is_view_of(arr, x) for x in ins if x is not None)
            if made:
                written[j] = arr
        if d.p.index not in self.constant and (not d.view or any(o is not None for o in written)):
            # every replay passes these very arrays: a kernel's checks of them are made once, here
            self.backend.record(self.graph, fixed_arrays_kernel(d.p.fn, ins, written), ins, written)
            self.launched.append(d.p.index)
        if self.bake is not None:
            for vid in d.p.outputs:
                if vid >= 0:
                    self.bake(vid, arrays[vid])


def copy_launch(ins: list, outs: list) -> tuple:
    """A recorded launch copying input 0 into output 0 (e.g. a contiguity fix)."""
    outs[0][...] = ins[0]
    return (outs[0],)


def shape_derived_values(plan: Any, initializers: Any) -> dict[int, frozenset[int]]:
    """value id -> the plan indices that compute it, for each value that is a pure
    function of tensor shapes: a Shape or Size (or a Constant node's value), then shape
    arithmetic (`SHAPE_ARITHMETIC`) fed only by such values and initializers (torch exports' Shape -> Gather -> Unsqueeze
    -> Concat -> Reshape chains, sized by `unk__N` dims no static resolution knows).

    Why a recording may bake such a value when every node computing it is captured:
    a replay checks the shapes of its segments' inputs (`CapturedGraph.mismatch`), and
    replays a segment only after every earlier one replayed. Inside captured segments
    every shape follows from those input shapes (outputs sized by values decline unless
    the values are themselves baked), so the Shape nodes at the chain's roots read the
    same shapes at every replay, and the arithmetic above them gives the same values."""
    derived: dict[int, frozenset[int]] = {}
    for p in plan.nodes:
        node = p.node
        if node.domain or node.subgraphs or node.outer_reads:
            continue
        ins = [i for i in p.inputs if i >= 0]
        if node.op_type == "Constant" and not ins:  # left in a branch, which load-time folding skips
            chain = frozenset((p.index,))
        elif node.op_type in SHAPE_SOURCES:
            if not ins:
                continue
            chain = frozenset((p.index,))
        elif node.op_type in SHAPE_ARITHMETIC:
            if not ins or not all(i in derived or i in initializers for i in ins) \
                    or not any(i in derived for i in ins):
                continue
            chain = frozenset((p.index,)).union(*(derived[i] for i in ins if i in derived))
        else:
            continue
        for o in p.outputs:
            if o >= 0:
                derived[o] = chain
    return derived


def constant_nodes(segments: list, plan: Any, derived: frozenset, storage: Any,
                   kept_out: set[int]) -> frozenset[int]:
    """Plan indices of the captured nodes a replay need not launch: every output is
    baked shape arithmetic (`derived`: wholly computed inside the captured segments),
    so by `shape_derived_values`' argument a replay that passed its input-shape checks
    would write the very values the recording wrote. A launch list that records
    computed work (the CPU backend) drops them: their arrays keep the recording's
    values, and each replay restores them into the executor's arrays.

    That holds while nothing else writes those bytes between replays: no node writes
    in place over one (an ALIAS of its owner), none is handed to the caller or bound
    by it (`kept_out`), and every eager step in the slot re-plans or retires the
    graphs first (`SlotCapture.next_action`)."""
    overwritten = aliased_owners(storage)
    constant = set()
    for seg in segments:
        if seg.kind != "captured":
            continue
        for k in seg.nodes:
            outs = [o for o in plan.nodes[k].outputs if o >= 0]
            if outs and all(o in derived and o not in kept_out and storage.storage.get(o) != ALIAS
                            and storage.owner.get(o, o) not in overwritten for o in outs):
                constant.add(k)
    return frozenset(constant)


def aliased_owners(storage: Any) -> frozenset[int]:
    """The owners whose bytes some node overwrites in place (an ALIAS shares them): after
    the step, such an owner's array holds the last writer's value, not its own."""
    return frozenset(storage.owner[vid] for vid, kind in storage.storage.items() if kind == ALIAS)


def small_enough_to_bake(shape: tuple | None) -> bool:
    if shape is None:
        return False
    n = 1
    for d in shape:
        n *= d
    return n <= SHAPE_FOLD_MAX_ELEMENTS


def growing_symbols(graph: Any) -> set[str]:
    """KV-length symbols: the sequence axis of rank-4 past/present KV inputs and outputs.

    Together with the symbols the decode-plan memo observes varying, these are the
    symbols whose ops cannot be captured: their shapes change every step.
    """
    symbols: set[str] = set()
    for vid in list(graph.inputs) + list(graph.outputs):
        v = graph.values[vid]
        if v.shape is not None and len(v.shape) == 4 and _KV_NAME.match(v.name):
            axis = v.shape[2]
            if isinstance(axis, str):
                symbols.add(axis)
    return symbols


def external_inputs(plan: Any, nodes: list[int]) -> list[int]:
    """Values a run of nodes reads but does not itself define."""
    defined: set[int] = set()
    ext: list[int] = []
    seen: set[int] = set()
    for k in nodes:
        p = plan.nodes[k]
        for v in p.inputs:
            if v >= 0 and v not in defined and v not in seen:
                seen.add(v)
                ext.append(v)
        defined.update(o for o in p.outputs if o >= 0)
    return ext


def _as_recorded(a: Any, entry: tuple) -> bool:
    """Whether `a` is the array a `binding_signature` entry describes: an array of that
    dtype, shape and strides at that address."""
    _, dtype, shape, strides, addr = entry
    return (dtype is not None and a is not None and hasattr(a, "nbytes") and a.shape == shape
            and a.strides == strides and a.dtype.str == dtype and address(a) == addr)


def binding_signature(arrays: list, vids: list[int]) -> tuple:
    return tuple(_identity(v, arrays[v]) for v in vids)


def _identity(vid: int, a: Any) -> tuple:
    if a is None or not hasattr(a, "shape"):
        return (vid, None, None, None, id(a))
    return (vid, a.dtype.str, tuple(a.shape), tuple(a.strides), address(a))


def describe_change(graph: Any, old: tuple, new: tuple, control_flow_outputs: set[int]) -> tuple[str, str]:
    """(retire reason, detail) for the first differing entry of two signatures."""
    for a, b in zip(old, new):
        if a == b:
            continue
        name = graph.values[a[0]].name
        what = ("dtype" if a[1] != b[1] else "shape" if a[2] != b[2] else
                "strides" if a[3] != b[3] else "address")
        if a[0] in control_flow_outputs and what == "shape":
            return "control_flow_shape_flip", f"{name} shape {a[2]} -> {b[2]}"
        detail = f"{name} {what}"
        if what == "shape":
            detail += f" {a[2]} -> {b[2]}"
        return "binding_changed", detail
    return "binding_changed", "input set changed"


def reads_only_baked(p: Any, baked: frozenset[int] | set[int]) -> bool:
    """Whether node `p` declines capture only for host reads, and every input it reads
    on the host is a value the recording may bake (`baked`: proven the same at every
    replay)."""
    verdict = p.capture
    if verdict.reason != "host_read" or not verdict.host_inputs:
        return False
    read = [p.inputs[i] for i in verdict.host_inputs if i < len(p.inputs) and p.inputs[i] >= 0]
    return bool(read) and all(vid in baked for vid in read)


def node_decline(p: Any, preallocated: list[bool], growing: set[str], bound: set[int],
                 quarantined: set[tuple[str, str]], values: list,
                 baked: frozenset[int] | set[int] = frozenset(),
                 shape_changes: dict | None = None, limited: dict | None = None,
                 observed: tuple = ()) -> CaptureDecline | None:
    """Why plan node `p` cannot be captured this step, or None when it can. A node
    whose only obstacle is reading `baked` values on the host can be. `shape_changes`
    (value -> two shapes the warm-up steps saw), `limited` (plan index -> the decline
    its segment's re-records earned) and `observed` (each value's shape at the last
    warm step, None where it was no array) come from the slot's history."""
    k = p.index
    if limited and k in limited:
        return limited[k]
    if (p.node.domain, p.node.op_type) in quarantined:
        return CaptureDecline(k, "quarantined_op", f"{p.node.op_type} broke a recording earlier")
    verdict = p.capture
    if not verdict.supported and not reads_only_baked(p, baked):
        reason = verdict.reason if verdict.reason in DECLINE_REASONS else "kernel_declined"
        detail = verdict.detail if reason == verdict.reason else f"{verdict.reason}: {verdict.detail}"
        return CaptureDecline(k, reason, detail)
    for j, vid in enumerate(p.outputs):
        if vid < 0:
            continue
        v = values[vid]
        if v.kind != "tensor" and not (v.kind == "unknown" and vid < len(observed) and observed[vid] is not None):
            # an untyped output (a contrib op shape inference does not know) is a tensor
            # once a warm step saw one
            what = "of unknown kind, and no warm step saw it" if v.kind == "unknown" else f"a {v.kind}"
            return CaptureDecline(k, "sequence_value", f"output {v.name!r} is {what}")
        # an output sized just in time from its inputs' shapes is recorded with the array
        # it got (a replay checks those shapes); one sized by input values cannot be
        if not preallocated[j] and p.spec.data_dependent_shape and not p.spec.produces_view \
                and not reads_only_baked(p, baked):  # baked values: the same size every replay
            return CaptureDecline(k, "data_dependent_shape",
                                  f"output {v.name!r} is sized by input values ({p.node.op_type})")
    for vid in (*p.inputs, *p.outputs):
        if vid < 0 or vid in bound:
            continue
        shape = values[vid].shape
        hit = tuple(sorted({s for d in shape or () if isinstance(d, str) for s in symbols_in(d) if s in growing}))
        if hit:
            return CaptureDecline(k, "growing_symbol",
                                  f"{values[vid].name!r} has shape {list(shape)}", hit)
    if shape_changes:
        for vid in (*p.inputs, *p.outputs):
            if vid >= 0 and vid not in bound and vid in shape_changes:
                before, now = shape_changes[vid]
                return CaptureDecline(k, "varying_shape",
                                      f"{values[vid].name!r} changed shape {before} -> {now} between warm-up steps")
    return None


def segment_plan(plan: Any, declines: dict[int, CaptureDecline], min_nodes: int,
                 ) -> tuple[list[Segment], list[CaptureDecline]]:
    """Cut the plan into captured segments and eager seams; short runs become seams."""
    segments: list[Segment] = []
    final: list[CaptureDecline] = []
    run: list[int] = []

    def close_run() -> None:
        if not run:
            return
        compute = [k for k in run if not plan.nodes[k].spec.produces_view]
        if len(compute) >= min_nodes:
            segments.append(Segment(len(segments), "captured", tuple(run)))
        else:
            for k in run:
                final.append(CaptureDecline(k, "segment_too_short",
                                            f"run of {len(compute)} compute nodes < {min_nodes}"))
            _append_eager(segments, run)
        run.clear()

    for p in plan.nodes:
        decline = declines.get(p.index)
        if decline is None:
            run.append(p.index)
            continue
        close_run()
        final.append(decline)
        _append_eager(segments, [p.index])
    close_run()
    return segments, sorted(final, key=lambda d: d.plan_index)


def _append_eager(segments: list[Segment], nodes: list[int]) -> None:
    if segments and segments[-1].kind == "eager" and segments[-1].last == nodes[0] - 1:
        segments[-1].nodes += tuple(nodes)
    else:
        segments.append(Segment(len(segments), "eager", tuple(nodes)))

"""Decode-plan memo (Stage 1) and cached view plan (Stage 2).

Shape resolution is a pure function of the symbol bindings. In steady one-token
decode only the length symbols move, so every value whose symbolic shape names
none of them resolves identically step after step. Stage 1 keeps that invariant
partition and re-substitutes only the variant tail. It is sound by its guard
(`DecodePlanMemo.mismatch`): a step replays only if it binds the same symbols,
agrees on every symbol not observed to vary, and presents the same
length-abstracted binding signature — so a symbol wrongly believed invariant
forces a rebuild the first time it changes, and a stale shape is never served.

Stage 2 goes one further for pure layout nodes whose outputs are invariant: once
their views are seen identical on two real steps, a replay reinstates the views
and skips dispatching those nodes. A view is a function of its source buffer and
its parameters, so both are guarded: the (address, capacity) of every source
buffer before the step, and the value of every runtime parameter input (a Slice's
starts, a Reshape's shape) when the node comes up; a node whose parameters moved is
dispatched after all and the plan is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .shapes import symbols_in

#: consecutive Stage-2 signature mismatches after which the view plan is latched off
STAGE2_MISMATCH_LIMIT = 2


def growth_transition(prev: dict[str, int], cur: dict[str, int]) -> bool:
    """Same symbols, at least one grew, none shrank: steady autoregressive decode."""
    if prev.keys() != cur.keys():
        return False
    grew = False
    for sym, value in cur.items():
        if value < prev[sym]:
            return False
        grew |= value > prev[sym]
    return grew


def why_not_growth(prev: dict[str, int], cur: dict[str, int]) -> str:
    if prev.keys() != cur.keys():
        return "symbol set changed"
    shrank = [f"{s} {prev[s]}->{v}" for s, v in cur.items() if v < prev[s]]
    if shrank:
        return "not a growth transition: " + ", ".join(shrank)
    return "not a growth transition: no symbol grew"


@dataclass
class DecodePlanMemo:
    reference: dict[str, int]  # bindings the invariant partition was built under
    varying: frozenset[str]  # symbols seen to change between two real steps
    invariant: dict[int, tuple | None]  # value id -> resolved shape, replayed verbatim
    variant: list[int]  # value ids re-substituted every replay
    signature: tuple  # length-abstracted caller-bound I/O signature
    #: `variant` by declared symbolic shape, ((shape, value ids), ...): a replay
    #: resolves each shape once (a decode model has a handful for its ~100 values)
    variant_groups: tuple = ()

    def mismatch(self, bindings: dict[str, int], signature: tuple) -> str | None:
        """None when this step may replay, else the reason it may not."""
        if signature != self.signature:
            return "binding signature changed: " + signature_diff(self.signature, signature)
        if bindings.keys() != self.reference.keys():
            return "symbol set changed"
        for sym, value in bindings.items():
            ref = self.reference[sym]
            if value != ref and sym not in self.varying:
                return f"non-varying symbol {sym} changed {ref}->{value}"
        return None


def group_by_shape(vids: list[int], values: list) -> tuple:
    """((declared shape, value ids), ...) in first-appearance order; an unhashable
    shape makes a group of its own."""
    groups: dict = {}
    alone = []
    for vid in vids:
        shape = values[vid].shape
        try:
            groups.setdefault(shape, []).append(vid)
        except TypeError:
            alone.append((shape, (vid,)))
    return tuple((shape, tuple(ids)) for shape, ids in groups.items()) + tuple(alone)


def signature_diff(old: tuple, new: tuple) -> str:
    old_map = {(name, role): rest for name, role, *rest in old}
    new_map = {(name, role): rest for name, role, *rest in new}
    for key in sorted(old_map.keys() | new_map.keys()):
        if key not in new_map:
            return f"{key[0]} no longer bound"
        if key not in old_map:
            return f"{key[0]} newly bound"
        if old_map[key][0] != new_map[key][0]:
            return f"{key[0]} dtype"
        if old_map[key] != new_map[key]:
            return f"{key[0]} declared shape"
    return "unknown"


def shape_mentions(shape: tuple | None, symbols: frozenset[str]) -> bool:
    return shape is not None and any(isinstance(d, str) and not symbols.isdisjoint(symbols_in(d))
                                     for d in shape)


@dataclass
class ViewPlan:
    """Stage 2: pure-view nodes to elide and the views to reinstate in their place."""

    nodes: frozenset[int]  # plan indices
    #: value id -> (view array, owner id, shape, strides, byte offset), from the reference step
    views: dict[int, tuple] = field(default_factory=dict)
    #: owner id -> (address, capacity in bytes) of every source buffer the views alias
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: plan index -> ((value id, parameter key), ...) for every runtime parameter input
    #: (a Slice's starts, a Reshape's shape): a view is a function of these values too,
    #: so a node is reinstated only while they are unchanged
    params: dict[int, tuple] = field(default_factory=dict)
    validated: bool = False
    #: plan index -> a check (`addresses.holds_now`) that the environment holds the
    #: source and runtime parameters its parameter key was last found equal on, where
    #: each parameter is immutable by construction (none, or a shape-fold value: a
    #: private copy no kernel writes). While it holds those very objects (a source array
    #: cannot move or change shape; the parameters cannot change), the key is unchanged
    #: without being recomputed
    same_source: dict[int, Any] = field(default_factory=dict)
    #: (check of the slot's buffers, check of the environment's initializer entries):
    #: the source arrays the guard last found in place are still the very ones there
    held_sources: tuple | None = None

    @property
    def state(self) -> str:
        return "validated" if self.validated else "candidate"


def view_plan_admission(p: Any, invariant: dict, observed: dict[int, tuple], stable_owner: Any,
                        initializers: Any) -> str | None:
    """None when layout node `p` may join the cached view plan, else why not.

    `observed` maps a value to (view, owner, shape, strides, offset) as seen this
    step; `stable_owner(owner)` says whether that owner's buffer is the executor's
    own and of invariant shape (so the guard's address check means something).
    """
    outs = [v for v in p.outputs if v >= 0]
    if not outs:
        return "no outputs"
    if any(v not in invariant for v in outs):
        return "an output's shape varies"
    if any(v not in observed for v in outs):
        return "an output was copied, not viewed"
    if p.inputs[0] not in invariant and p.inputs[0] not in initializers:
        return "the source's shape varies (so would the view's offsets)"
    if not all(stable_owner(observed[v][1]) for v in outs):
        return "the source is not stable storage of this executor (a feed, or just-in-time)"
    return None


#: ops that turn an input's shape into a value
SHAPE_SOURCES = frozenset({"Shape", "Size"})
#: ops that shape arithmetic chains through (torch exports: Shape -> Gather -> Unsqueeze
#: -> Concat -> Reshape's shape input); a node of these folds only when every input is
#: an initializer or itself shape-derived
SHAPE_ARITHMETIC = frozenset({"Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Add", "Sub", "Mul",
                              "Div", "Neg", "Slice", "Reshape", "Identity", "Equal", "Where", "Max",
                              "Min", "Range", "ReduceProd", "Abs"})
#: folded values are kept per slot; only small ones are worth keeping
SHAPE_FOLD_MAX_ELEMENTS = 1024


def shape_fold_nodes(plan: Any, shapes: dict, invariant: dict, initializers: Any, *,
                     values: list, varying: frozenset, overwritten: frozenset) -> frozenset[int]:
    """Plan indices of the shape arithmetic whose values, under a memo replay, equal
    the reference step's: Shape/Size of a value whose shape names no varying symbol
    (and is resolved), or a Shape whose start/end take only dims that name none (a
    growing cache's batch: `values`' symbolic shapes, `varying` the memo's symbols),
    then every node of SHAPE_ARITHMETIC fed only by such values and initializers. A node
    with an output in `overwritten` (its buffer written in place later in the step, so
    what the step leaves there is not the value, and the fold copies it after the run)
    is not folded, but what it feeds may be: it runs on every replay. A pure function
    of shapes, so it is exact by construction; the executor still checks it once
    (`ShapeFold.validated`) before trusting it."""
    derived: set[int] = set()
    nodes: set[int] = set()
    for p in plan.nodes:
        node = p.node
        if node.domain or node.subgraphs or node.outer_reads:
            continue
        if node.op_type in SHAPE_SOURCES:
            src = p.inputs[0] if p.inputs else -1
            if src < 0 or shapes.get(src) is None:
                continue
            if src not in invariant and not (node.op_type == "Shape"
                                             and _sliced_dims_fixed(node, values[src].shape, varying)):
                continue
        elif node.op_type in SHAPE_ARITHMETIC:
            ins = [i for i in p.inputs if i >= 0]
            if not ins or not all(i in derived or i in initializers for i in ins) \
                    or not any(i in derived for i in ins):
                continue
        else:
            continue
        outs = [o for o in p.outputs if o >= 0]
        if not outs or not all(o in invariant and shapes.get(o) is not None
                               and _numel(shapes[o]) <= SHAPE_FOLD_MAX_ELEMENTS for o in outs):
            continue
        derived.update(outs)
        if overwritten.isdisjoint(outs):
            nodes.add(p.index)
    return frozenset(nodes)


def _sliced_dims_fixed(node: Any, shape: tuple | None, varying: frozenset) -> bool:
    """Whether a Shape node with start/end (opset 15) reads only dims of `shape` that
    name no varying symbol. Without either attribute it reads every dim: then the whole
    shape must be invariant, as for any Shape."""
    if shape is None or ("start" not in node.attrs and "end" not in node.attrs):
        return False
    rank = len(shape)
    start, end = (int(node.attrs.get("start", 0)), int(node.attrs.get("end", rank)))
    start, end = (min(max(x + rank if x < 0 else x, 0), rank) for x in (start, end))
    return not shape_mentions(tuple(shape[start:end]), varying)


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass
class ShapeFold:
    """Shape arithmetic served from the reference step instead of dispatched."""

    nodes: frozenset[int]
    #: value id -> a private copy of its value at the reference step
    values: dict[int, Any] = field(default_factory=dict)
    validated: bool = False
    #: value id -> the same on the host (a recording that bakes a value reads this)
    host: dict[int, Any] = field(default_factory=dict)


@dataclass
class MemoStats:
    """Counters of what the memo did over a session (see `session.memo_stats()`)."""

    primed: int = 0
    rebuilt: int = 0
    replayed: int = 0
    disabled: int = 0
    ineligible: int = 0
    verified: int = 0
    views_reused: int = 0
    dispatch_elided: int = 0
    shape_folded: int = 0
    stage2_mismatches: int = 0
    stage2_latched: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))

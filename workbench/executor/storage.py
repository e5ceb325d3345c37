"""Who owns which bytes: owners, zero-copy views, in-place aliases, and when storage dies.

A `StoragePlan` is derived from the plan and the resolved shapes of one binding
signature. It is static for that signature, so decisions (which node writes into
which dead input, which buffers are pinned) are the same every step — stable
addresses are what device-graph capture needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .plan import Plan

INPUT, INITIALIZER, OWNER, VIEW, ALIAS = "input", "initializer", "owner", "view", "alias"


@dataclass
class StoragePlan:
    #: value id -> storage kind (INPUT, INITIALIZER, OWNER, VIEW, ALIAS)
    storage: dict[int, str] = field(default_factory=dict)
    #: value id -> the value owning its bytes (itself for owners); one hop, never a view
    owner: dict[int, int] = field(default_factory=dict)
    #: plan index of each value's producer (-1 for inputs and initializers)
    first_def: dict[int, int] = field(default_factory=dict)
    #: plan index of each value's last reader (len(plan) for graph outputs)
    last_use: dict[int, int] = field(default_factory=dict)
    #: owner id -> plan index from which a view pins it for the rest of the run
    pinned_from: dict[int, int] = field(default_factory=dict)
    #: plan index -> (output position, input position) written in place
    in_place: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: plan index -> owner ids whose storage dies after that node (release_dead_values)
    release_after: dict[int, list[int]] = field(default_factory=dict)

    #: owner id -> every value whose bytes it holds (itself, its views and aliases)
    sharers: dict[int, list[int]] = field(default_factory=dict)


def plan_storage(plan: Plan, *, views: bool, compute_in_place: bool, release: bool,
                 shapes: dict[int, tuple | None], protected: set[int]) -> StoragePlan:
    """Decide storage for every value.

    `shapes` are the resolved shapes (None when unknown before the run);
    `protected` values (graph outputs, caller-bound outputs) never lend their
    buffer to an in-place write nor are released.
    """
    graph = plan.graph
    sp = StoragePlan()
    n = len(plan.nodes)
    for vid in graph.inputs + graph.outer_inputs:
        sp.storage[vid], sp.owner[vid], sp.first_def[vid] = INPUT, vid, -1
    for vid in graph.initializers:
        sp.storage[vid], sp.owner[vid], sp.first_def[vid] = INITIALIZER, vid, -1
    for vid, last in plan.last_use.items():
        sp.last_use[vid] = last
    storage_end: dict[int, int] = {}  # owner -> last plan index any sharer is read

    def share(vid: int, owner: int) -> None:
        sp.owner[vid] = owner
        end = sp.last_use.get(vid, sp.first_def.get(vid, -1))
        storage_end[owner] = max(storage_end.get(owner, -1), end)

    for vid in list(sp.owner):
        share(vid, vid)
    for p in plan.nodes:
        k = p.index
        for vid in p.outputs:
            if vid >= 0:
                sp.first_def[vid] = k
        src = p.inputs[0] if p.inputs else -1
        # With views off a layout node copies into its own buffer -- but one whose
        # output shape is known only after it runs has no buffer, and its kernel's
        # result is a view all the same: plan it as one (its source stays pinned).
        as_view = views or any(shapes.get(v) is None for v in p.outputs if v >= 0)
        if as_view and p.spec.produces_view and src >= 0 and src in sp.owner:
            owner = sp.owner[src]
            for vid in p.outputs:
                if vid >= 0:
                    sp.storage[vid] = VIEW
                    share(vid, owner)
            sp.pinned_from.setdefault(owner, k)
            continue
        slot_input = _in_place_candidate(p, sp, storage_end, shapes, protected) if compute_in_place else None
        for j, vid in enumerate(p.outputs):
            if vid < 0:
                continue
            if slot_input is not None and j == slot_input[0]:
                x = p.inputs[slot_input[1]]
                sp.storage[vid] = ALIAS
                sp.in_place[k] = slot_input
                share(vid, sp.owner[x])
            else:
                sp.storage[vid] = OWNER
                share(vid, vid)
    for vid, owner in sp.owner.items():
        sp.sharers.setdefault(owner, []).append(vid)
    if release:
        for owner, end in storage_end.items():
            if (sp.storage.get(owner) == OWNER and owner not in sp.pinned_from
                    and not any(v in protected for v in sp.sharers[owner]) and 0 <= end < n):
                sp.release_after.setdefault(end, []).append(owner)
    return sp


def overwritten_in_place(sp: StoragePlan) -> frozenset[int]:
    """The values whose bytes a later node writes in place: every value sharing the
    buffer of an in-place output but the last one written there and the views made of
    the buffer after it (a step leaves that value in the buffer; what the others'
    arrays hold by then is a later value)."""
    last: dict[int, int] = {}  # owner -> the last value written into its buffer in place
    for vid, kind in sp.storage.items():
        if kind == ALIAS:
            owner = sp.owner[vid]
            if owner not in last or sp.first_def[vid] > sp.first_def[last[owner]]:
                last[owner] = vid
    return frozenset(v for owner, final in last.items() for v in sp.sharers.get(owner, ())
                     if v != final and not (sp.storage[v] == VIEW and sp.first_def[v] > sp.first_def[final]))


def _in_place_candidate(p: Any, sp: StoragePlan, storage_end: dict[int, int],
                        shapes: dict[int, tuple | None], protected: set[int]) -> tuple[int, int] | None:
    """(output position 0, input position) when output 0 may overwrite a dead input's buffer."""
    if not p.spec.may_run_in_place or not p.outputs or p.outputs[0] < 0:
        return None
    y = p.outputs[0]
    if y in protected or shapes.get(y) is None:
        return None
    y_dtype = p.info.output_dtypes[0]
    for pos, x in enumerate(p.inputs[: len(p.info.input_dtypes)]):
        if x < 0 or sp.storage.get(x) not in (OWNER, ALIAS) or x in protected:
            continue
        owner = sp.owner[x]
        if owner in sp.pinned_from or storage_end.get(owner, -1) != p.index:
            continue  # a view pins it, or some sharer is still read later
        if x in p.inputs[pos + 1:] or x in p.inputs[:pos]:
            continue  # read twice by this node
        # symbolically equal too, so the decision holds for every binding of the
        # same symbols (the decode-plan memo reuses this plan across steps)
        if (shapes.get(x) == shapes[y] and p.info.input_dtypes[pos] == y_dtype
                and p.info.input_shapes[pos] == p.info.output_shapes[0]):
            return (0, pos)
    return None

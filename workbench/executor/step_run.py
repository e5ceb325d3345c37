"""One run's scratch: `StepRun`, what the node loop, the capture runner and the memo's
view plan share for the length of one `Executor.run`, and nothing longer.

The executor makes one per run and hands it down: the capture runner reads the slot,
the values and what the memo may let a recording bake from it, runs the nodes through
its `run_nodes`, and tells it what a replay restored (owners, views, the nodes it
served). Nothing here outlives the run; what a slot keeps from step to step is its
`SlotState`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .slot_state import SlotState


@dataclass(eq=False)
class StepRun:
    """The scratch of one run of one slot."""

    #: the slot this run is in (its prepared plan, buffers, memo and captured graphs)
    state: SlotState
    #: the value table (the executor's, for its whole life), filled as nodes run
    arrays: list
    #: symbol values; the symbols nodes sized just in time reveal join them during the run
    bindings: dict[str, int]
    #: the Recording this run writes into, or None (tracing off)
    rec: Any = None
    #: the Recording's node log, extended between kernels (`Recording.node_log`); for an
    #: untraced If branch timing its kernels (`Executor.time_kernels`), a list of its own
    node_log: list | None = None
    #: the host clock timing traced nodes, or None where the backend's timers do
    clock: Any = None
    #: the node loop: `run_nodes(plan indices, recorder=None)`; a recorder
    #: (`capture.LaunchRecorder`) is told of each node while a segment is recorded
    run_nodes: Callable[..., None] | None = None
    #: owners some zero-copy view of this run references: pinned for the rest of it
    pinned: set[int] = field(default_factory=set)
    #: owner -> the plan index after which its storage was released (release mode)
    released: dict[int, int] = field(default_factory=dict)
    #: value -> owner: the storage plan's own dict until a layout node's output needs
    #: another owner (`set_owner` copies it then), so a step whose views all alias as
    #: planned copies nothing
    owners: dict[int, int] = field(default_factory=dict)
    #: owner -> the address of its array this run (view offsets are taken from it)
    owner_address: dict[int, int] = field(default_factory=dict)
    #: value -> (array, owner, shape, strides in elements, byte offset) of each
    #: zero-copy view this run's layout nodes made (the view plan and recordings read it)
    observed: dict[int, tuple] = field(default_factory=dict)
    #: plan indices a validated shape fold serves this run (their values reinstated)
    folded: Any = ()
    #: plan indices a validated view plan may elide this run, and those it did
    elided: Any = ()
    reinstated: list[int] = field(default_factory=list)
    #: Ifs skipped this run: their predicate and outputs were as last run
    skipped_ifs: list[int] = field(default_factory=list)
    #: a cached view was found stale this run (the view plan is dropped after it)
    view_plan_stale: bool = False
    #: value -> (array, host copy) a recording may take as constants: the validated
    #: shape fold's values this run reinstates
    baked: dict = field(default_factory=dict)
    #: a shape fold was found and awaits its check against the kernels
    fold_pending: bool = False
    #: what captured replays served this run: plan indices, and host seconds replaying
    replayed_nodes: list[int] = field(default_factory=list)
    replayed_s: float = 0.0

    def owner_of(self, vid: int) -> int:
        """This run's owner of `vid` (the value itself where it owns its bytes)."""
        return self.owners.get(vid, vid)

    def set_owner(self, vid: int, owner: int) -> None:
        """Make `owner` this run's owner of `vid`, copying the storage plan's dict at the
        first change (it is shared by every run of the slot)."""
        owners = self.owners
        if owners.get(vid) != owner:
            if owners is self.state.storage.owner:
                owners = self.owners = dict(owners)
            owners[vid] = owner

    def restore_views(self, views: tuple, pins: tuple, owners: frozenset) -> None:
        """Zero-copy views a captured replay restored (rows as `Recording.view` takes
        them), with the pin rows of their `owners`: each owner is pinned this run, and
        the trace gets the pin and view rows an eager step's layout nodes would give."""
        pinned = self.pinned
        if not pinned.isdisjoint(owners):
            pins = tuple(row for row in pins if row[1] not in pinned)
        pinned |= owners
        if self.rec is not None:
            self.rec.buffer_span(pins)
            self.rec.view_span(views)


__all__ = ["StepRun"]

"""Typed trace events: one frozen dataclass per event kind.

The executor never builds these: it emits into a `Recording`'s columns (cheap), and
`Recording.events()` builds these objects lazily, in emission order, for people who
prefer objects to frames. Every event carries `step`, the index returned by the
`Recording.begin_step` in force when it was emitted (-1 before the first step).

Ids are the executor's: `value_id` indexes the static values table, `plan_index`
the static nodes table (-1: before any node, e.g. a graph input; ``n_nodes``: after
the last node, e.g. a graph output's last use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "BufferEvent",
    "Event",
    "InPlaceAlias",
    "LivenessRow",
    "Materialized",
    "NodeExecuted",
    "StepBegan",
    "StepEnded",
    "TableRow",
    "ViewCreated",
]


@dataclass(frozen=True, slots=True)
class StepBegan:
    """A run (one decode step) began in `slot` ("primary", "verify", ...) during `phase`."""

    step: int
    slot: str
    phase: str
    bindings: dict[str, int]  # symbol -> bound value


@dataclass(frozen=True, slots=True)
class StepEnded:
    """The run ended after `wall_s` seconds; `extra` holds the step's extra columns (token, text...)."""

    step: int
    wall_s: float
    resident_peak_bytes: int
    extra: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeExecuted:
    """Plan node `plan_index` ran: mode "eager" (dispatched), "replayed" (device graph) or "elided"."""

    step: int
    plan_index: int
    mode: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class BufferEvent:
    """A value's buffer: "alloc" (new storage), "reuse" (kept from an earlier run), "release", "pin"."""

    step: int
    event: str
    value_id: int
    nbytes: int
    plan_index: int


@dataclass(frozen=True, slots=True)
class ViewCreated:
    """`value_id` is a view of owner `source_id`: shape, element strides (may be <= 0), byte offset."""

    step: int
    value_id: int
    source_id: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    byte_offset: int
    plan_index: int


@dataclass(frozen=True, slots=True)
class InPlaceAlias:
    """Computed in place: `value_id` was written into the (dead) buffer of `into_id`."""

    step: int
    value_id: int
    into_id: int
    plan_index: int


@dataclass(frozen=True, slots=True)
class Materialized:
    """A kernel needed a copy of `value_id` (`nbytes`), e.g. a contiguous input; `reason` says why."""

    step: int
    plan_index: int
    value_id: int
    nbytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class LivenessRow:
    """One value's lifetime in a step.

    storage: "owner" | "view" | "alias" | "input" | "initializer"; `owner_id` the value
    whose buffer holds it; `first_def` the producer's plan index (-1 for inputs and
    initializers); `last_use` the last consumer's (n_nodes for graph outputs);
    `released_at` the plan index its buffer was released at, or -1.
    """

    step: int
    value_id: int
    storage: str
    owner_id: int
    nbytes: int
    first_def: int
    last_use: int
    pinned: bool
    released_at: int


@dataclass(frozen=True, slots=True)
class TableRow:
    """A row added to a generic table with `Recording.add_row` (memo timeline, capture segments...)."""

    table: str
    step: int
    columns: dict[str, Any]


Event = (StepBegan | StepEnded | NodeExecuted | BufferEvent | ViewCreated | InPlaceAlias
         | Materialized | LivenessRow | TableRow)

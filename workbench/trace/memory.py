"""From a step's liveness rows to the activation-memory planner's intervals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .memory_planner import Interval

if TYPE_CHECKING:  # pragma: no cover
    from .recording import Recording

__all__ = ["liveness_intervals", "one_buffer_per_value_bytes", "rows_by_step", "step_intervals"]


def liveness_intervals(value_ids: Sequence[int], storage: Sequence[str], owner_ids: Sequence[int],
                       nbytes: Sequence[int], first_def: Sequence[int],
                       last_use: Sequence[int]) -> list[Interval]:
    """One interval per "owner" row (key = value id, size = nbytes).

    An owner lives from its producer (`first_def`) to its last use, extended to the
    last use of every view or in-place alias that lives in its buffer (followed
    through chains of views/aliases to the owner). Inputs and initializers are not
    activations and get no interval; neither do views and aliases (they own no bytes).
    An owner never read lives at least during its producer.
    """
    owners: dict[int, list[int]] = {}
    parent: dict[int, int] = {}
    for vid, st, own, nb, fd, lu in zip(value_ids, storage, owner_ids, nbytes, first_def, last_use):
        if st == "owner":
            owners[vid] = [int(nb), int(fd), max(int(lu), int(fd))]
        elif st in ("view", "alias") and own != vid:
            parent[vid] = own
    for vid, st, lu in zip(value_ids, storage, last_use):
        if st not in ("view", "alias"):
            continue
        root, hops = parent.get(vid, vid), 0
        while root in parent and hops <= len(parent):  # guard against cycles
            root, hops = parent[root], hops + 1
        o = owners.get(root)
        if o is not None and lu > o[2]:
            o[2] = int(lu)
    return [Interval(vid, size, start, end) for vid, (size, start, end) in owners.items()]


def rows_by_step(rec: Recording) -> dict[int, list[int]]:
    """Step -> positions of its rows in the liveness table."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(rec._t["liveness"]["step"]):
        out.setdefault(s, []).append(i)
    return out


def _select(rec: Recording, idx: list[int]) -> tuple[list, ...]:
    lv = rec._t["liveness"]
    return tuple([lv[c][i] for i in idx]
                 for c in ("value_id", "storage", "owner_id", "nbytes", "first_def", "last_use"))


def step_intervals(rec: Recording, step: int, idx: list[int] | None = None) -> list[Interval]:
    """The planner intervals of one step of a Recording (empty if it has no liveness rows)."""
    if idx is None:
        idx = [i for i, s in enumerate(rec._t["liveness"]["step"]) if s == step]
    return liveness_intervals(*_select(rec, idx))


def one_buffer_per_value_bytes(rec: Recording, idx: list[int]) -> int:
    """Bytes of the "owner" rows: one buffer per activation, never reused."""
    lv = rec._t["liveness"]
    st, nb = lv["storage"], lv["nbytes"]
    return sum(int(nb[i]) for i in idx if st[i] == "owner")

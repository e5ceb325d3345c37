"""Activation-memory planner: what a liveness-based allocator would need.

Pure functions over lifetime intervals (no executor imports). Each value that owns
storage is an `Interval` live over the plan indices ``[start, end]`` (inclusive).
`plan_offsets` places every interval at a byte offset inside one arena so that no
two intervals that are live at the same time overlap in memory; its `peak` is the
arena size a liveness-based allocator would need, to compare with `naive_total`
(one buffer per value, never reused) and with `lower_bound` (the most bytes ever
live at once: no placement can do better).

Placement is a portfolio of greedy heuristics (each interval in turn at an aligned
offset that does not collide with any already-placed, time-overlapping interval);
the smallest peak wins:

- greedy by size: largest first (ties: longest-lived first), first fit (lowest offset);
- greedy by size, best fit (the smallest gap that holds it, else the top);
- longest-lived first (first fit and best fit), and largest size x lifetime first;
- greedy by breadth: the time steps with the most live bytes first, each step's
  unplaced intervals largest first, first fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "HEURISTICS",
    "Interval",
    "MemoryPlan",
    "lower_bound",
    "plan_offsets",
    "validate_plan",
]


@dataclass(frozen=True)
class Interval:
    """A value's storage: `size` bytes live over plan indices [start, end] inclusive."""

    key: object
    size: int
    start: int
    end: int


@dataclass
class MemoryPlan:
    """Offsets (key -> byte offset in the arena) and the sizes that go with them.

    `peak` is the arena size (max of offset + size), `lower_bound` the most bytes
    live at once, `naive_total` the sum of all sizes (one buffer per value).
    `heuristic` names the placement that won.
    """

    offsets: dict
    peak: int
    lower_bound: int
    naive_total: int
    heuristic: str = field(default="")

    @property
    def ratio(self) -> float:
        """peak / lower_bound (1.0 is optimal; 1.0 as well when nothing is live)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0


def _check(intervals: Sequence[Interval]) -> None:
    seen = set()
    for iv in intervals:
        if iv.size < 0:
            raise ValueError(f"interval {iv.key!r}: size {iv.size} is negative")
        if iv.end < iv.start:
            raise ValueError(f"interval {iv.key!r}: end {iv.end} is before start {iv.start}")
        if iv.key in seen:
            raise ValueError(f"interval key {iv.key!r} appears more than once")
        seen.add(iv.key)


def _live_profile(intervals: Sequence[Interval]) -> tuple[np.ndarray, np.ndarray]:
    """(times, live bytes at each time) over every time where some interval starts."""
    if not intervals:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.fromiter((iv.start for iv in intervals), np.int64, len(intervals))
    ends = np.fromiter((iv.end for iv in intervals), np.int64, len(intervals))
    sizes = np.fromiter((iv.size for iv in intervals), np.int64, len(intervals))
    # +size at start, -size at end + 1; the live total only rises at a start time
    times = np.concatenate([starts, ends + 1])
    delta = np.concatenate([sizes, -sizes])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    running = np.cumsum(delta)
    # value after all events of the same time: take the last event of each run
    last_of_time = np.append(times[1:] != times[:-1], True)
    return times[last_of_time], running[last_of_time]


def lower_bound(intervals: Iterable[Interval]) -> int:
    """Max over time of the sum of the sizes of the simultaneously live intervals."""
    ivs = list(intervals)
    _, live = _live_profile(ivs)
    return int(live.max()) if live.size else 0


def _align(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


#: intervals living at most this many steps are indexed per time step; longer ones are scanned
_SHORT = 32


class _Arena:
    """Placed intervals, indexed for "who is live at some time in [start, end]" queries.

    Short-lived intervals (the bulk of an activation liveness) sit in one bucket per
    time step they span, so a short query only touches its own steps; the few
    long-lived ones are scanned.
    """

    def __init__(self, t_min: int, t_max: int):
        self.t0 = t_min
        self.buckets: list[list[int]] = [[] for _ in range(t_max - t_min + 1)]
        self.start: list[int] = []
        self.end: list[int] = []
        self.off: list[int] = []
        self.top: list[int] = []  # off + size
        self.longs: list[int] = []

    def colliding(self, start: int, end: int) -> list[tuple[int, int]]:
        """(offset, offset + size) of placed intervals live at some time in [start, end], by offset."""
        st, en, off, top = self.start, self.end, self.off, self.top
        if end - start < _SHORT:
            seen: set[int] = set()
            b = self.buckets
            for t in range(start - self.t0, end - self.t0 + 1):
                seen.update(b[t])
            seen.update(j for j in self.longs if st[j] <= end and en[j] >= start)
            busy = [(off[j], top[j]) for j in seen]
        else:
            busy = [(off[j], top[j]) for j in range(len(st)) if st[j] <= end and en[j] >= start]
        busy.sort()
        return busy

    def add(self, start: int, end: int, off: int, size: int) -> None:
        j = len(self.start)
        self.start.append(start)
        self.end.append(end)
        self.off.append(off)
        self.top.append(off + size)
        if end - start < _SHORT:
            b = self.buckets
            for t in range(start - self.t0, end - self.t0 + 1):
                b[t].append(j)
        else:
            self.longs.append(j)


def _first_fit(busy: list[tuple[int, int]], size: int, alignment: int) -> int:
    cur = 0
    for lo, hi in busy:
        if lo - cur >= size:
            return cur
        if hi > cur:
            cur = _align(hi, alignment)
    return cur


def _best_fit(busy: list[tuple[int, int]], size: int, alignment: int) -> int:
    cur = 0
    best, best_gap = -1, None
    for lo, hi in busy:
        gap = lo - cur
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = cur, gap
        if hi > cur:
            cur = _align(hi, alignment)
    return best if best >= 0 else cur


def _place(order: Sequence[Interval], alignment: int,
           fit: Callable[[list[tuple[int, int]], int, int], int]) -> tuple[dict, int]:
    offsets: dict = {}
    if not order:
        return offsets, 0
    arena = _Arena(min(iv.start for iv in order), max(iv.end for iv in order))
    peak = 0
    for iv in order:
        if iv.size == 0:  # occupies no address range: collides with nothing
            offsets[iv.key] = 0
            continue
        off = fit(arena.colliding(iv.start, iv.end), iv.size, alignment)
        arena.add(iv.start, iv.end, off, iv.size)
        offsets[iv.key] = off
        peak = max(peak, off + iv.size)
    return offsets, peak


def _by_size(intervals: Sequence[Interval]) -> list[Interval]:
    return sorted(intervals, key=lambda iv: (-iv.size, -(iv.end - iv.start), iv.start))


def _by_duration(intervals: Sequence[Interval]) -> list[Interval]:
    return sorted(intervals, key=lambda iv: (-(iv.end - iv.start), -iv.size, iv.start))


def _by_area(intervals: Sequence[Interval]) -> list[Interval]:
    return sorted(intervals, key=lambda iv: (-(iv.end - iv.start + 1) * iv.size, -iv.size, iv.start))


def _by_breadth(intervals: Sequence[Interval]) -> list[Interval]:
    times, live = _live_profile(intervals)
    # breadth at any time t = live at the last profile time <= t; an interval's
    # widest moment is the max over the profile times inside [start, end] plus
    # the value in force at its start (always a profile time, since it starts there)
    keyed = []
    for iv in intervals:
        lo = int(np.searchsorted(times, iv.start, side="left"))
        hi = int(np.searchsorted(times, iv.end, side="right"))
        seg = live[lo:hi]
        j = int(np.argmax(seg))
        keyed.append((-int(seg[j]), lo + j, -iv.size, iv.start, iv))
    keyed.sort(key=lambda t: t[:4])
    return [t[4] for t in keyed]


#: name -> (ordering, placement); `plan_offsets` keeps the smallest peak
HEURISTICS: dict[str, tuple[Callable, Callable]] = {
    "size_first_fit": (_by_size, _first_fit),
    "size_best_fit": (_by_size, _best_fit),
    "duration_first_fit": (_by_duration, _first_fit),
    "duration_best_fit": (_by_duration, _best_fit),
    "area_first_fit": (_by_area, _first_fit),
    "breadth_first_fit": (_by_breadth, _first_fit),
}


def plan_offsets(intervals: list[Interval], alignment: int = 64,
                 heuristics: Iterable[str] | None = None) -> MemoryPlan:
    """Assign each interval an `alignment`-aligned byte offset; keep the smallest peak.

    Guarantees: every offset is a multiple of `alignment`; two intervals that are live
    at a common time never share a byte; ``peak >= lower_bound``. `heuristics` picks
    a subset of `HEURISTICS` (default: all of them).
    """
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    ivs = list(intervals)
    _check(ivs)
    lb = lower_bound(ivs)
    naive = sum(iv.size for iv in ivs)
    names = list(heuristics) if heuristics is not None else list(HEURISTICS)
    if not names:
        raise ValueError("plan_offsets needs at least one heuristic")
    best: MemoryPlan | None = None
    for name in names:
        if name not in HEURISTICS:
            raise ValueError(f"unknown heuristic {name!r}; known: {sorted(HEURISTICS)}")
        order_fn, fit = HEURISTICS[name]
        offsets, peak = _place(order_fn(ivs), alignment, fit)
        if best is None or peak < best.peak:
            best = MemoryPlan(offsets=offsets, peak=peak, lower_bound=lb, naive_total=naive,
                              heuristic=name)
        if peak == lb:  # cannot do better
            break
    assert best is not None
    return best


def validate_plan(intervals: Sequence[Interval], plan: MemoryPlan, alignment: int = 1) -> None:
    """Raise AssertionError if two time-overlapping intervals share a byte (or bad offsets)."""
    ivs = [iv for iv in intervals if iv.size > 0]
    assert set(plan.offsets) == {iv.key for iv in intervals}, "plan does not place every interval"
    if not ivs:
        assert plan.peak == 0
        return
    st = np.array([iv.start for iv in ivs], np.int64)
    en = np.array([iv.end for iv in ivs], np.int64)
    lo = np.array([plan.offsets[iv.key] for iv in ivs], np.int64)
    hi = lo + np.array([iv.size for iv in ivs], np.int64)
    assert (lo >= 0).all(), "negative offset"
    assert (lo % alignment == 0).all(), f"offset not aligned to {alignment}"
    assert int(hi.max()) == plan.peak, "peak is not max(offset + size)"
    time = (st[:, None] <= en[None, :]) & (st[None, :] <= en[:, None])
    space = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    clash = time & space
    np.fill_diagonal(clash, False)
    if clash.any():
        i, j = map(int, np.argwhere(clash)[0])
        raise AssertionError(f"intervals {ivs[i]} and {ivs[j]} overlap in time and memory "
                             f"(offsets {lo[i]} and {lo[j]})")

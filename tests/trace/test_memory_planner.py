"""The activation-memory planner: placement is always legal, tight on simple and transformer-like liveness."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.trace.memory_planner import (
    HEURISTICS,
    Interval,
    MemoryPlan,
    lower_bound,
    plan_offsets,
    validate_plan,
)


def brute_lower_bound(ivs):
    if not ivs:
        return 0
    lo, hi = min(iv.start for iv in ivs), max(iv.end for iv in ivs)
    return max(sum(iv.size for iv in ivs if iv.start <= t <= iv.end) for t in range(lo, hi + 1))


intervals_strategy = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(-3, 40), st.integers(0, 25)),
    max_size=40,
).map(lambda rows: [Interval(k, size, s, s + d) for k, (size, s, d) in enumerate(rows)])


@settings(max_examples=200, deadline=None)
@given(intervals_strategy, st.sampled_from([1, 8, 64]))
def test_plan_is_legal_and_bounded(ivs, alignment):
    plan = plan_offsets(ivs, alignment)
    validate_plan(ivs, plan, alignment)  # no time-overlapping pair shares a byte; offsets aligned
    assert plan.lower_bound == lower_bound(ivs) == brute_lower_bound(ivs)
    assert plan.peak >= plan.lower_bound
    assert plan.naive_total == sum(iv.size for iv in ivs)
    if alignment == 1:
        assert plan.peak <= plan.naive_total
    assert plan.heuristic in HEURISTICS


@settings(max_examples=60, deadline=None)
@given(intervals_strategy, st.sampled_from(sorted(HEURISTICS)))
def test_every_heuristic_alone_is_legal(ivs, name):
    plan = plan_offsets(ivs, 16, heuristics=[name])
    validate_plan(ivs, plan, 16)
    assert plan.heuristic == name
    assert plan.peak >= plan.lower_bound


def test_portfolio_keeps_the_smallest_peak():
    rng = random.Random(7)
    for _ in range(20):
        ivs = [Interval(k, rng.randint(1, 1000), s := rng.randint(0, 30), s + rng.randint(0, 6))
               for k in range(30)]
        best = plan_offsets(ivs, 1)
        assert best.peak == min(plan_offsets(ivs, 1, heuristics=[h]).peak for h in HEURISTICS)


def test_validate_plan_catches_a_clash():
    ivs = [Interval("a", 10, 0, 2), Interval("b", 10, 2, 3)]
    bad = MemoryPlan(offsets={"a": 0, "b": 5}, peak=15, lower_bound=20, naive_total=20)
    with pytest.raises(AssertionError, match="overlap in time and memory"):
        validate_plan(ivs, bad)


# -- optimal on simple cases ------------------------------------------------------------


def test_empty_and_single():
    p = plan_offsets([])
    assert (p.peak, p.lower_bound, p.naive_total, p.offsets) == (0, 0, 0, {})
    p = plan_offsets([Interval("x", 100, 3, 7)])
    assert (p.peak, p.lower_bound, p.naive_total, p.offsets) == (100, 100, 100, {"x": 0})


def test_disjoint_in_time_share_one_slot():
    ivs = [Interval(i, size, i, i) for i, size in enumerate([100, 300, 200, 50])]
    p = plan_offsets(ivs)
    assert p.peak == p.lower_bound == 300
    assert set(p.offsets.values()) == {0}
    assert p.naive_total == 650


def test_all_live_together_stack_up():
    ivs = [Interval(i, size, 0, 5) for i, size in enumerate([64, 128, 192])]
    p = plan_offsets(ivs)
    assert p.peak == p.lower_bound == p.naive_total == 384
    validate_plan(ivs, p, 64)


def test_alignment_rounds_offsets_up():
    ivs = [Interval("a", 100, 0, 1), Interval("b", 10, 0, 1)]
    p = plan_offsets(ivs, alignment=64)
    assert p.offsets == {"a": 0, "b": 128}
    assert (p.peak, p.lower_bound) == (138, 110)
    p1 = plan_offsets(ivs, alignment=1)
    assert p1.peak == p1.lower_bound == 110


def test_chain_reuses_the_dead_buffer():
    # a -> b -> c -> d: each value is read only by the next node
    sizes = [10, 20, 10, 30]
    ivs = [Interval(i, s, i, i + 1) for i, s in enumerate(sizes)]
    p = plan_offsets(ivs, alignment=1)
    assert p.lower_bound == 40  # c + d
    assert p.peak == 40
    validate_plan(ivs, p)


def test_zero_sized_intervals_take_no_room():
    ivs = [Interval("e", 0, 0, 9), Interval("x", 64, 0, 9), Interval("y", 64, 0, 9)]
    p = plan_offsets(ivs)
    assert p.peak == p.lower_bound == 128
    assert p.offsets["e"] == 0


def test_lower_bound_counts_inclusive_ends():
    assert lower_bound([Interval(0, 5, 0, 1), Interval(1, 7, 1, 2)]) == 12
    assert lower_bound([Interval(0, 5, 0, 1), Interval(1, 7, 2, 3)]) == 7


@pytest.mark.parametrize("bad, match", [
    ([Interval("a", -1, 0, 1)], "negative"),
    ([Interval("a", 1, 3, 1)], "before start"),
    ([Interval("a", 1, 0, 1), Interval("a", 2, 0, 1)], "more than once"),
])
def test_rejects_malformed_intervals(bad, match):
    with pytest.raises(ValueError, match=match):
        plan_offsets(bad)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alignment"):
        plan_offsets([], alignment=0)
    with pytest.raises(ValueError, match="unknown heuristic"):
        plan_offsets([Interval(0, 1, 0, 0)], heuristics=["nope"])


# -- synthetic transformer-like liveness --------------------------------------------------


def decoder_liveness(rng: random.Random, layers: int) -> list[Interval]:
    """A decoder forward: a residual stream through attention + MLP blocks, each
    activation read by the next one or two nodes, plus small shape/mask helpers."""
    hidden = rng.choice([256, 512, 768, 1024]) * 4
    seq = rng.choice([1, 7, 16, 64])
    heads = rng.choice([4, 8, 12])
    act, scores = seq * hidden, heads * seq * seq * 4
    ivs: list[Interval] = []
    t = 0

    def add(size: int, start: int, end: int) -> None:
        ivs.append(Interval(len(ivs), size, start, end))

    embed_at = t
    t += 1
    block_start = t
    for _ in range(layers):
        block_start = t
        # size, how many nodes later its last reader runs
        for size, life in [(act, 4), (act, 3), (act, 6), (act, 5), (scores, 1), (scores, 1),
                           (act, 1), (act, 1), (act, 4), (act, 1), (4 * act, 1), (4 * act, 1),
                           (act, 1), (act, 1 + rng.randint(0, 1))]:
            add(size, t, t + life)
            t += 1
        for _ in range(rng.randint(1, 4)):
            s = rng.randint(block_start, t - 1)
            add(rng.choice([8, 16, 64, 4 * seq]), s, min(t, s + rng.randint(0, 3)))
    add(act, embed_at, block_start + 1)
    add(seq * 50_000 * 4 // 8, t, t + 1)  # logits
    return ivs


def chain_liveness(rng: random.Random, n: int) -> list[Interval]:
    """A long op chain: mostly single-use outputs of mixed sizes, some skips, a few long-lived."""
    ivs = []
    for t in range(n):
        size = rng.choice([64, 256, 4096, 16384, 65536, 262144]) * rng.randint(1, 4)
        r = rng.random()
        life = 1 if r < 0.6 else 2 if r < 0.8 else rng.randint(3, 8) if r < 0.97 else rng.randint(10, 60)
        ivs.append(Interval(t, size, t, min(n, t + life)))
    return ivs


@pytest.mark.parametrize("seed", range(40))
def test_transformer_like_peak_within_1_15_of_lower_bound(seed):
    rng = random.Random(seed)
    ivs = decoder_liveness(rng, layers=rng.randint(1, 6))
    p = plan_offsets(ivs)
    validate_plan(ivs, p, 64)
    assert p.peak <= 1.15 * p.lower_bound, (p.peak, p.lower_bound, p.heuristic)
    assert p.peak < p.naive_total  # reuse pays off on a chain of layers


def test_synthetic_chains_peak_within_1_15_of_lower_bound():
    rng = random.Random(0)
    ratios = []
    for _ in range(60):
        ivs = chain_liveness(rng, rng.randint(10, 300))
        p = plan_offsets(ivs)
        validate_plan(ivs, p, 64)
        ratios.append(p.peak / p.lower_bound)
    assert max(ratios) <= 1.15, max(ratios)

"""A blend schedule's selector: the float path equals exact arithmetic, and its cost does
not grow with the number of points."""

from __future__ import annotations

import math
import random

import pytest

from epochal.data.datasets.blend_schedule import BlendSchedule, BlendSelector


def irregular(points, sources, interpolation, seed, small=False, span=2_000_000):
    """Points at random samples; small weights (0..3) make exact rounding ties frequent."""
    rng = random.Random(seed)
    starts = [0, *sorted(rng.sample(range(1, span), points - 1))]
    pts = []
    for start in starts:
        if small:
            weights = [rng.randrange(4) for _ in range(sources)]
            weights[rng.randrange(sources)] += 1
        else:
            weights = [round(rng.random(), 4) for _ in range(sources)]
            weights[0] += 0.0001
        pts.append((start, weights))
    return BlendSchedule(pts, interpolation)


@pytest.mark.parametrize("interpolation", ["step", "linear"])
@pytest.mark.parametrize("small", [False, True])
def test_float_path_selects_exactly_what_exact_arithmetic_selects(interpolation, small):
    rng = random.Random(7)
    for trial in range(6):
        sched = irregular(
            rng.choice([2, 3, 9, 40]), rng.choice([2, 3, 5]), interpolation, trial, small
        )
        origin = rng.choice([0, rng.randrange(2_000_000)])
        fast, exact = BlendSelector(sched, origin), BlendSelector(sched, origin)
        exact.fast = False
        ns = [origin + rng.randrange(2_200_000) for _ in range(150)] + [
            origin + x for x in range(60)
        ]
        for n in ns:
            assert fast.locate(n) == exact.locate(n), (trial, n)
        for n in ns[:20]:
            assert fast.counts(n) == exact.counts(n), (trial, n)
        assert exact.exact_lookups > 0 and fast.exact_lookups < exact.exact_lookups


def _lookup_cost(points):
    """Node lookups and machine words of exact arithmetic for 300 random samples."""
    sched = irregular(points, 4, "linear", points, span=10_000_000)
    sel = BlendSelector(sched)
    rng = random.Random(3)
    for _ in range(300):
        sel.locate(rng.randrange(11_000_000))
    lookups = sel._left.cache_info().misses
    # a float lookup is O(1) words after one bisection over the segments; an exact one
    # works on integers as long as the schedule's common denominator
    words = sel._q.bit_length() // 64 + 1
    return lookups, sel.exact_lookups, words


def test_per_sample_cost_grows_at_most_logarithmically_with_the_points():
    lookups2, exact2, words2 = _lookup_cost(2)
    lookups1024, exact1024, words1024 = _lookup_cost(1024)
    # exact arithmetic's integers grow with the points: the cost the float path avoids
    assert words1024 > 100 * words2
    assert lookups1024 == lookups2 == 1200  # two tree levels, two lookups each, per sample
    cost2 = (lookups2 - exact2) * math.log2(2 + 1) + exact2 * words2
    cost1024 = (lookups1024 - exact1024) * math.log2(1024 + 1) + exact1024 * words1024
    assert exact1024 <= 3  # near-tie lookups are rare with irregular weights
    assert cost1024 <= 2 * math.log2(1024 + 1) / math.log2(2 + 1) * cost2


@pytest.mark.parametrize("interpolation", ["step", "linear"])
def test_float_path_holds_at_a_hundred_billion_samples(interpolation):
    """Errors grow with the sample number: still exact, and still rarely left to exact."""
    sched = irregular(5, 4, interpolation, 11, span=10**11)
    fast, exact = BlendSelector(sched), BlendSelector(sched)
    exact.fast = False
    rng = random.Random(4)
    for _ in range(150):
        n = rng.randrange(12 * 10**10)
        assert fast.locate(n) == exact.locate(n) and fast.locate(n + 1) == exact.locate(n + 1)
    assert fast.exact_lookups <= 0.05 * fast._left.cache_info().misses

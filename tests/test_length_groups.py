"""The encoder's pass planner: runs over length-sorted texts, optimal under its cost, never over the cap."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlinf_search.retrieval.length_groups import plan_groups


def _cost(lengths, runs, pass_cost):
    return sum(pass_cost + (end - begin) * lengths[end - 1] for begin, end in runs)


def _all_plans(count, max_group):
    """Every split of ``count`` texts into consecutive runs of at most ``max_group``."""
    for cuts in itertools.product((False, True), repeat=count - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [count]
        runs = list(zip(bounds, bounds[1:]))
        if all(end - begin <= max_group for begin, end in runs):
            yield runs


@pytest.mark.parametrize("seed", range(6))
def test_plan_is_the_cheapest_split_under_the_cap(seed):
    rng = np.random.default_rng(seed)
    lengths = sorted(rng.integers(5, 80, size=int(rng.integers(1, 11))).tolist())
    max_group = int(rng.integers(1, 6))
    runs = plan_groups(lengths, max_group, pass_cost_tokens=30)
    assert runs[0][0] == 0 and runs[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert all(0 < end - begin <= max_group for begin, end in runs)
    cheapest = min(_cost(lengths, plan, 30) for plan in _all_plans(len(lengths), max_group))
    assert _cost(lengths, runs, 30) == cheapest


def test_short_texts_are_not_padded_to_a_long_one():
    # Fifteen questions of 12 tokens and one of 60: passes of 16 would pad all sixteen to 60.
    runs = plan_groups([12] * 15 + [60], 16)
    assert runs == [(0, 15), (15, 16)]
    assert plan_groups([], 16) == []
    with pytest.raises(ValueError, match="max_group must be >= 1"):
        plan_groups([3], 0)

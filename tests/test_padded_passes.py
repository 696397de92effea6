"""Passes of the padded layout: rows of similar length together, every row once, the token budget kept, and a
two-rank plan over a real rollout-shaped batch that every rank can follow."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from rlinf_search.data.batch import RolloutBatch, cut_padded_rows, padded_pass_cost
from rlinf_search.data.rank_plan import plan_passes


def _cost(groups: list[list[int]], tokens: list[int]) -> float:
    return sum(padded_pass_cost(len(g), max(tokens[r] for r in g)) for g in groups)


def _all_cuts(order: list[int]):
    """Every cut of ``order`` into consecutive runs."""
    for mask in itertools.product((False, True), repeat=len(order) - 1):
        groups, start = [], 0
        for i, cut in enumerate(mask, start=1):
            if cut:
                groups.append(order[start:i])
                start = i
        yield groups + [order[start:]]


@pytest.mark.parametrize("seed", range(6))
def test_the_cut_is_the_cheapest_cut_into_runs_of_sorted_rows(seed):
    rng = random.Random(seed)
    tokens = [rng.choice([rng.randint(60, 80), rng.randint(120, 400)]) for _ in range(9)]
    rows = list(range(len(tokens)))
    groups = cut_padded_rows(rows, tokens, None)
    assert sorted(r for g in groups for r in g) == rows
    order = sorted(rows, key=lambda r: (-tokens[r], r))
    cheapest = min(_cost(g, tokens) for g in _all_cuts(order))
    assert _cost(groups, tokens) == pytest.approx(cheapest)


def test_a_batch_of_long_searches_and_short_answers_runs_as_two_passes_at_half_the_padded_tokens():
    tokens = [196, 152, 152, 147, 147, 126, 121, 118] + [73] * 24
    groups = cut_padded_rows(list(range(32)), tokens, None)
    padded = sum(len(g) * max(tokens[r] for r in g) for g in groups)
    assert len(groups) >= 2 and all(tokens[r] == 73 for r in groups[-1])
    assert padded < 0.55 * 32 * max(tokens)


def test_the_token_budget_holds_and_a_row_over_it_goes_alone():
    tokens = [500, 90, 90, 90, 90, 80, 80, 80]
    groups = cut_padded_rows(list(range(8)), tokens, 200)
    assert [0] in groups
    assert all(len(g) * max(tokens[r] for r in g) <= 200 for g in groups if len(g) > 1)
    assert sorted(r for g in groups for r in g) == list(range(8))


def _batch(lengths: list[int], prompt: int = 8) -> RolloutBatch:
    """Rows of ``prompt`` prompt tokens and ``length - prompt`` response tokens, right-padded responses."""
    width = max(lengths) - prompt
    attention = torch.zeros(len(lengths), prompt + width, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention[row, : n] = 1
    ids = torch.randint(1, 100, attention.shape) * attention
    response_mask = attention[:, prompt:].clone()
    return RolloutBatch(input_ids=ids, attention_mask=attention, response_mask=response_mask,
                        rollout_logprobs=torch.zeros(response_mask.shape), rewards=torch.zeros(len(lengths)),
                        uids=[f"q{row}" for row in range(len(lengths))], prompt_length=prompt)


def test_two_ranks_get_equal_pass_counts_and_every_row_once_with_uneven_lengths():
    lengths = [200, 190, 40, 40, 41, 39, 42, 150, 38, 37, 36]
    batch = _batch(lengths)
    plans = [plan_passes(batch, list(range(len(lengths))), rank=r, world_size=2, max_tokens=None, padded=True)
             for r in range(2)]
    assert len(plans[0].passes) == len(plans[1].passes)
    assert sorted(plans[0].rows + plans[1].rows) == list(range(len(lengths)))
    for plan in plans:
        for group in filter(None, plan.passes):
            widths = [lengths[r] for r in group]
            assert max(widths) < 2 * min(widths), f"a pass mixes long and short rows: {widths}"

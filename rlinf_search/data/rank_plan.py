"""Equal work on every data-parallel rank: which rows each rank trains or scores, pass by pass.

FSDP all-gathers a layer's weights in every forward and reduce-scatters its gradients in every backward,
and DDP all-reduces in every backward: all ranks must run the same number of passes, or one rank's
collective meets another's and the run hangs (NCCL) or aborts (gloo). So every rank gets the whole batch
and computes the same plan for all ranks, with no collective needed to agree on it:

1. a mini-batch's rows are dealt to ranks balanced by tokens (longest first, to the least-loaded rank);
2. each rank cuts its share into micro-batches by the token budget (packed rows), or into runs of similar
   length (padded rows, where each row costs as much as the pass's longest: ``cut_padded_rows``);
3. every rank runs as many micro-batches as the busiest rank; a rank with fewer pads with empty ones
   (``None``): a pass over a tiny row whose loss weight is zero, so the collectives still line up.

Mini-batches come from ``split_into``: exactly ``n`` of them (some empty when there are fewer rows than
``n``), so every rank takes the same number of optimizer steps.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from rlinf_search.data.batch import (
    RolloutBatch,
    cut_padded_rows,
    pack_rows_by_budget,
    prompt_units,
)


def split_into(rows: list[int], parts: int) -> list[list[int]]:
    """``rows`` cut into exactly ``parts`` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(rows), parts)
    out, start = [], 0
    for part in range(parts):
        stop = start + size + (part < extra)
        out.append(rows[start:stop])
        start = stop
    return out


def balance_by_tokens(rows: list[int], tokens: list[int], ranks: int) -> list[list[int]]:
    """``rows`` dealt to ``ranks`` shares with near-equal token sums (longest row first, each to the share
    with the fewest tokens so far); each share in ascending row order."""
    heap = [(0, rank) for rank in range(ranks)]
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for row in sorted(rows, key=lambda r: (-tokens[r], r)):
        load, rank = heapq.heappop(heap)
        shares[rank].append(row)
        heapq.heappush(heap, (load + tokens[row], rank))
    return [sorted(share) for share in shares]


@dataclass
class RankWork:
    """One rank's passes over one mini-batch (or one forward-only batch)."""

    passes: list[list[int] | None]
    """Row groups, one per forward (and backward); None is a padding pass with no rows of its own. Every
    rank's list has the same length."""
    tokens: int
    """Model tokens (``response_mask`` 1) of the whole mini-batch, every rank's rows together: the
    token-mean's denominator."""
    sequences: int
    """Rows of the whole mini-batch, every rank's together."""

    @property
    def rows(self) -> list[int]:
        return sorted(row for group in self.passes if group for row in group)


def plan_passes(batch: RolloutBatch, rows: list[int], *, rank: int, world_size: int,
                max_tokens: int | None = None, rows_per_pass: int | None = None, padded: bool = False,
                by_prompt: bool = False) -> RankWork:
    """This rank's passes over ``rows`` of ``batch``: its token-balanced share cut by ``max_tokens``
    (or into ``rows_per_pass`` rows each), padded to the busiest rank's number of passes. ``padded``: the
    passes run the padded layout, so rows of similar length go together. ``by_prompt`` (the layout that computes a
    shared prompt once, ``actor.model.share_prompts``): a prompt's rows stay in one pass, each prompt's tokens
    counted once; with ``rows_per_pass`` rows are cut one by one as without it."""
    tokens = batch.token_counts().tolist()
    if by_prompt and rows_per_pass is None:
        # A prompt's rows are one unit, its prompt's tokens counted once (as the layout computes them).
        units = prompt_units(batch, rows)
        prompt_tokens = batch.attention_mask[:, : batch.prompt_length].sum(dim=1).tolist()
        unit_tokens = [prompt_tokens[unit[0]] + sum(tokens[r] - prompt_tokens[r] for r in unit) for unit in units]

        def rows_of(cut: list[int]) -> list[int]:
            return sorted(row for u in cut for row in units[u])

        shares = balance_by_tokens(list(range(len(units))), unit_tokens, world_size)
        per_rank = [[rows_of(cut) for cut in _cut(share, unit_tokens, max_tokens, None, padded)] for share in shares]
    else:
        shares = balance_by_tokens(rows, tokens, world_size)
        per_rank = [_cut(share, tokens, max_tokens, rows_per_pass, padded) for share in shares]
    longest = max(len(groups) for groups in per_rank)
    mine: list[list[int] | None] = list(per_rank[rank])
    mine += [None] * (longest - len(mine))
    model_tokens = int(batch.response_mask[rows].sum()) if rows else 0
    return RankWork(passes=mine, tokens=model_tokens, sequences=len(rows))


def _cut(share: list[int], tokens: list[int], max_tokens: int | None, rows_per_pass: int | None,
         padded: bool) -> list[list[int]]:
    if not share:
        return []
    if rows_per_pass is not None:
        order = sorted(share, key=lambda r: (-tokens[r], r))
        return [sorted(order[i: i + rows_per_pass]) for i in range(0, len(order), rows_per_pass)]
    if padded:
        return cut_padded_rows(share, tokens, max_tokens)
    return pack_rows_by_budget(share, tokens, max_tokens)


def padding_row(batch: RolloutBatch) -> RolloutBatch:
    """The batch's shortest row with no model tokens: what a padding pass runs (it costs one short
    sequence and contributes exactly zero to every loss and gradient)."""
    counts = batch.token_counts().tolist()
    shortest = min(range(len(counts)), key=lambda r: (counts[r], r))
    row = batch.select([shortest])
    row.response_mask = row.response_mask.new_zeros(row.response_mask.shape)
    return row


def run_minibatches(num_rows: int, step: Callable[[list[int]], dict[str, float]], *, epochs: int,
                    n_minibatches: int, rng: random.Random | None,
                    units: list[list[int]] | None = None) -> dict[str, float]:
    """``epochs`` passes of ``step`` over exactly ``n_minibatches`` mini-batches of a batch's rows (reshuffled
    each epoch by ``rng``; None keeps rollout order). Every rank draws the same order from an identically
    seeded ``rng``, so all ranks step through the same mini-batches. Returns each metric's mean over the
    steps that reported it. The actor and the critic update through this, so both see the same mini-batches.
    ``units``: rows that stay in one mini-batch (a prompt's group, ``prompt_units``); shuffled and cut as units."""
    history: list[dict[str, float]] = []
    for _ in range(epochs):
        order = [list(unit) for unit in units] if units is not None else [[row] for row in range(num_rows)]
        if rng is not None:
            rng.shuffle(order)
        for minibatch in split_into(order, n_minibatches):
            history.append(step(sorted(row for unit in minibatch for row in unit)))
    return mean_by_key(history)


def mean_by_key(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the rows that report it (optimizer steps, mini-batches)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}

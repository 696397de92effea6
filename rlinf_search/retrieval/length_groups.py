"""Splitting a batch of tokenized texts into forward passes that waste little compute on padding.

An encoder pass pads every text to the longest in it, so a pass costs about ``texts x longest`` tokens of work
plus a fixed cost per pass (kernel launches, pooling, Python). Texts sorted by token length are cut into
consecutive groups by dynamic programming over that cost: short questions go together, a long one does not drag
fifteen short ones to its length, and no pass is so small that its fixed cost dominates. On a 2-core CPU this
encoded batches of 32 and 64 HotpotQA questions 1.2x faster than passes of 16 texts sorted by characters
(docs/history/benchmarks.md section 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PASS_COST_TOKENS = 64
"""The fixed cost of one forward pass, in padded tokens' worth of work: measured on a 2-core CPU with MiniLM,
32-128 gave rates within noise of each other, each 1.2x and more over fixed groups of 16."""


def plan_groups(sorted_lengths: Sequence[int], max_group: int, *,
                pass_cost_tokens: int = PASS_COST_TOKENS) -> list[tuple[int, int]]:
    """``(begin, end)`` runs over ``sorted_lengths`` (ascending) of at most ``max_group`` texts each, covering them
    all, that minimise the summed ``texts x longest + pass_cost_tokens`` of the passes."""
    if max_group < 1:
        raise ValueError(f"max_group must be >= 1, got {max_group}")
    count = len(sorted_lengths)
    best = np.zeros(count + 1)  # best[j]: the cheapest cost of the first j texts
    cut = np.zeros(count + 1, dtype=np.int64)
    for end in range(1, count + 1):
        # Every run ending here, vectorised over where it begins; ascending, so its last text is its longest.
        begins = np.arange(max(0, end - max_group), end)
        costs = best[begins] + pass_cost_tokens + (end - begins) * sorted_lengths[end - 1]
        pick = int(np.argmin(costs))
        best[end], cut[end] = costs[pick], begins[pick]
    runs = []
    end = count
    while end > 0:
        runs.append((int(cut[end]), end))
        end = int(cut[end])
    return runs[::-1]

"""Rows across a tensor-parallel group: its ranks compute one model together, so they need the same rows.

The runner hands each actor rank its own share of a batch (as for data parallelism). A
tensor-parallel group therefore first joins its ranks' shares (``join_batches``), trains or scores
the joined rows together, and each rank keeps the results of its own rows. Plain torch: the joining
is tested without megatron-core.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch
import torch.nn.functional as F

from rlinf_search.data.batch import RolloutBatch


def join_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch of every row of ``batches`` in order, re-padded: prompts on the left, responses on the right."""
    prompt = max(b.prompt_length for b in batches)
    response = max(b.response_length for b in batches)

    def pad(value: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        if value.dim() == 2 and value.shape[1] == batch.input_ids.shape[1]:  # prompt + response columns
            return F.pad(value, (prompt - batch.prompt_length, response - batch.response_length))
        if value.dim() == 2:  # response columns
            return F.pad(value, (0, response - value.shape[1]))
        return value

    joined = {}
    for field in fields(RolloutBatch):
        if field.name in ("prompt_length", "extra"):
            continue
        values = [getattr(b, field.name) for b in batches]
        if all(v is None for v in values):
            joined[field.name] = None
        elif any(v is None for v in values):
            raise ValueError(f"join_batches: {field.name} is set on some shares and not on others")
        elif isinstance(values[0], list):
            joined[field.name] = [item for v in values for item in v]
        else:
            joined[field.name] = torch.cat([pad(v, b) for v, b in zip(values, batches)])
    keys = set(batches[0].extra)
    joined["extra"] = {key: [item for b in batches for item in b.extra[key]] for key in keys}
    return replace(batches[0], prompt_length=prompt, **joined)


def own_rows(joined: torch.Tensor, batches: list[RolloutBatch], index: int) -> torch.Tensor:
    """The ``[rows, T]`` slice of a joined ``[all rows, T_max]`` result that belongs to share ``index``."""
    start = sum(len(b) for b in batches[:index])
    mine = batches[index]
    return joined[start: start + len(mine), : mine.response_length]


def exchange_rows(batch: RolloutBatch, group, group_size: int) -> list[RolloutBatch]:
    """Every tensor-parallel rank's share, in rank order (a collective over ``group``)."""
    import torch.distributed as dist

    if group_size == 1:
        return [batch]
    shares: list[RolloutBatch | None] = [None] * group_size
    # Batches are small CPU tensors next to the model; pickling them through the group is simplest.
    dist.all_gather_object(shares, batch, group=group)
    return shares

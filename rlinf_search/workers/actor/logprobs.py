"""Forward-only scoring of a batch's response tokens on one data-parallel rank (old and reference log-probs).

Shared by the actor (current and reference policy) and the inference worker, so every component
scores tokens the same way the engine sampled them: ``log_softmax(logits / T)``. Each rank scores its
token-balanced share of the whole batch, in as many passes as the busiest rank (``data.rank_plan``):
a sharded model gathers its layers in every pass, so the ranks' pass counts must agree.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from rlinf_search.data.batch import RolloutBatch
from rlinf_search.data.rank_plan import padding_row, plan_passes
from rlinf_search.workers.actor.token_scoring import layout_batch, to_device


@dataclass
class ForwardLogprobs:
    """What a log-prob pass (the actor's own, or the InferenceGroup's) returns for one rank's rows."""

    rows: list[int]
    """The batch rows this rank scored (its share; the driver merges the ranks' shares)."""
    old: torch.Tensor | None
    """[len(rows), T] log-probs under the current policy, the "old" policy of the coming update; None
    unless ``algorithm.recompute_logprobs``."""
    ref: torch.Tensor | None
    """[len(rows), T] log-probs under the frozen reference model; None unless ``algorithm.kl_beta`` > 0."""


@torch.no_grad()
def score_rows(scorer: torch.nn.Module, batch: RolloutBatch, *, rank: int, world_size: int, packed: bool,
               temperature: float, max_tokens: int | None, rows_per_pass: int | None,
               device: torch.device | str, autocast=None, share_prompts: bool = False) -> tuple[list[int], torch.Tensor]:
    """(this rank's rows, their ``[rows, T]`` log-probs) under ``scorer`` (a ``TokenScorer``, maybe wrapped).

    ``rows_per_pass`` (``algorithm.logprob_forward_micro_batch_size``) fixes the rows of a pass; else
    passes are packed to ``max_tokens``. ``share_prompts`` (padded rows only): rows of one prompt go in one pass,
    laid out with the prompt once (``shared_prompts.py``)."""
    work = plan_passes(batch, list(range(len(batch))), rank=rank, world_size=world_size, max_tokens=max_tokens,
                       rows_per_pass=rows_per_pass, padded=not packed, by_prompt=share_prompts)
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    was_training = scorer.training
    scorer.eval()
    for group in work.passes:
        part = batch.select(group) if group else padding_row(batch)
        layout = to_device(layout_batch(part, packed=packed, model_tokens_only=True, share_prompts=share_prompts),
                           device)
        with autocast if autocast is not None else contextlib.nullcontext():
            flat = scorer(layout, temperature=temperature, with_entropy=False).logprobs
        if group:
            out[torch.tensor(group), : part.response_length] = layout.to_rows(flat.float()).cpu()
    scorer.train(was_training)
    rows = work.rows
    return rows, out[torch.tensor(rows, dtype=torch.long)] if rows else out[:0]


def place_rows(shape: tuple[int, int], shares: list[tuple[list[int], torch.Tensor]]) -> torch.Tensor:
    """A ``[B, T]`` float32 tensor from ranks' ``(rows, [len(rows), t])`` shares (zeros elsewhere)."""
    out = torch.zeros(shape, dtype=torch.float32)
    for rows, values in shares:
        if rows:
            out[torch.tensor(rows, dtype=torch.long), : values.shape[1]] = values.float()
    return out

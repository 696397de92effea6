"""Log-probs (and entropy) of response tokens under a causal LM, batch after batch.

Shared by the actor (current and old policy) and the inference worker (old and reference policy),
so every component scores tokens the same way the engine sampled them: log_softmax(logits / T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_search.algorithms import entropy_from_logits
from rlinf_search.data.batch import RolloutBatch, split_by_token_budget


@dataclass
class ForwardLogprobs:
    """What a log-prob pass (the actor's own, or the InferenceGroup's) returns for its rows."""

    old: torch.Tensor | None
    """[rows, T] log-probs under the current policy, the "old" policy of the coming update; None
    unless ``algorithm.recompute_logprobs``."""
    ref: torch.Tensor | None
    """[rows, T] log-probs under the frozen reference model; None unless ``algorithm.kl_beta`` > 0."""


def forward_groups(batch: RolloutBatch, *, rows_per_pass: int | None, max_tokens: int | None) -> list[list[int]]:
    """Row groups of a forward-only pass: ``rows_per_pass`` rows each
    (``algorithm.logprob_forward_micro_batch_size``), else the token budget. Rows of similar length
    go together (sorted by real tokens), so little of each pass is padding."""
    if rows_per_pass is None:
        return split_by_token_budget(batch, max_tokens)
    counts = batch.token_counts().tolist()
    order = sorted(range(len(counts)), key=lambda i: -counts[i])
    return [sorted(order[i: i + rows_per_pass]) for i in range(0, len(order), rows_per_pass)]


def response_logprobs(model: torch.nn.Module, batch: RolloutBatch, *, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` log-probs of the response tokens (and their entropy when asked)."""
    device = next(model.parameters()).device
    input_ids, attention = batch.input_ids.to(device), batch.attention_mask.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions).logits
    p, t = batch.prompt_length, batch.response_length
    # Position p-1+j predicts response token j.
    response_logits = logits[:, p - 1: p - 1 + t].float() / temperature
    logprobs = torch.log_softmax(response_logits, dim=-1)
    targets = input_ids[:, p: p + t].unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, targets).squeeze(-1)
    entropy = entropy_from_logits(response_logits) if with_entropy else None
    return token_logprobs, entropy


@torch.no_grad()
def batched_response_logprobs(model: torch.nn.Module, batch: RolloutBatch, groups: list[list[int]], *,
                              temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` log-probs of the whole batch, computed micro-batch by micro-batch (``groups`` of rows)."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    was_training = model.training
    model.eval()
    for rows in groups:
        part = batch.select(rows)
        logprobs, _ = response_logprobs(model, part, temperature=temperature)
        out[torch.tensor(rows), : part.response_length] = logprobs.float().cpu()
    model.train(was_training)
    return out

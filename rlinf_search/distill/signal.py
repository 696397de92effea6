"""The distillation term of the advantage: per-token reverse KL to the teacher on model tokens.

``kl_t = log p_student(x_t) - log p_teacher(x_t)`` on every scored model token (the student's
log-prob is the old one, taken at the rollout temperature like the teacher's). The term is
``-coef * sum_{k >= t, same turn} discount^(k-t) * kl_k``, clipped to ``[-clip, clip]``: with
``discount`` 0 each token answers for its own KL; with 1, for the rest of its turn. Unscored tokens
(observations, unaligned tokens, trajectories the teacher failed on) add nothing and pass the KL of
later tokens through unchanged.
"""

from __future__ import annotations

import torch

from rlinf_search.distill.config import DistillConfig


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ``student - teacher`` where ``scored``, 0 elsewhere."""
    return torch.where(scored, student - teacher, torch.zeros_like(student))


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: which model turn each token belongs to (a turn is a run of mask-1 tokens; observation
    tokens take the id of the turn before them, which they never join since they add no KL)."""
    starts = (response_mask == 1) & torch.nn.functional.pad(response_mask[:, :-1] != 1, (1, 0), value=True)
    return torch.cumsum(starts.long(), dim=1)


def distill_term(kl: torch.Tensor, scored: torch.Tensor, response_mask: torch.Tensor,
                 config: DistillConfig) -> torch.Tensor:
    """``[B, T]`` the advantage term on model tokens (0 elsewhere)."""
    kl = torch.where(scored, kl, torch.zeros_like(kl))
    if config.discount > 0:
        turns = turn_ids(response_mask)
        summed = torch.zeros_like(kl)
        running = torch.zeros(kl.shape[0], dtype=kl.dtype, device=kl.device)
        for t in range(kl.shape[1] - 1, -1, -1):
            if t + 1 < kl.shape[1]:
                same_turn = turns[:, t] == turns[:, t + 1]
                running = torch.where(same_turn, running, torch.zeros_like(running))
            running = kl[:, t] + config.discount * running
            summed[:, t] = running
        kl = summed
    if config.center and bool(scored.any()):
        # A baseline: the batch's mean per scored token of what each token answers for (its KL, or its
        # discounted sum over the rest of its turn). It leaves the expected gradient as it is (on the
        # student's own samples E[grad log p] = 0) and stops nearly every token getting a negative advantage.
        # After the sum, not before: a per-token mean taken off before it would be summed too, taking more
        # off tokens with more of the turn after them (a length bias).
        kl = torch.where(scored, kl - kl[scored].mean(), kl)
    term = -config.coef * kl
    if config.clip is not None:
        term = term.clamp(-config.clip, config.clip)
    return torch.where(response_mask.bool(), term, torch.zeros_like(term))


def combine(advantages: torch.Tensor, term: torch.Tensor, response_mask: torch.Tensor,
            config: DistillConfig) -> torch.Tensor:
    """The advantage the policy loss uses: ``advantages + term`` (``add``) or ``term`` alone (``only``)."""
    base = advantages if config.mode == "add" else torch.zeros_like(advantages)
    return torch.where(response_mask.bool(), base + term, advantages)

"""Per-token losses: the policy losses (``POLICY_LOSSES``; PPO's with asymmetric and dual clip built in), the
entropy bonus, the critic loss.

Each returns losses per token ``[B, T]`` (0 on mask-0 tokens) and its metrics; the caller reduces the
losses with :func:`rlinf_search.algorithms.aggregation.aggregate_loss`, once, in the configured mode.
Metrics are means over this call's model tokens (detached scalars).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf_search.algorithms.aggregation import masked_mean, zero_outside
from rlinf_search.registry import Registry

LOG_RATIO_CLAMP = 20.0
"""lp - old is clamped to +-20 before exp (verl's guard): a stale token cannot give an inf ratio."""


@dataclass
class PolicyLossOutput:
    """The PPO loss per token and what to log about it."""

    token_losses: torch.Tensor
    """``[B, T]``: the clipped surrogate loss per model token; 0 on mask-0 tokens."""
    clip_fraction: torch.Tensor
    """Share of model tokens where the clipped term was chosen (its gradient is 0 there)."""
    dual_clip_fraction: torch.Tensor
    """Share of model tokens (any advantage sign) where the dual-clip bound -A c was chosen."""
    approx_kl: torch.Tensor
    """Mean of old - lp over model tokens (k1 of the old policy to the current one)."""
    ratio_mean: torch.Tensor
    """Mean of exp(lp - old) over model tokens."""
    ratio_max: torch.Tensor
    """Largest exp(lp - old) on a model token (0 if there is none)."""
    clipped: torch.Tensor | None = None
    """``[B, T]`` bool: the tokens where the clipped term was chosen (per-lag metrics); None: not reported."""

    def metrics(self, prefix: str = "actor/") -> dict[str, float]:
        """The scalar metrics as floats, for a logger."""
        names = ("clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean", "ratio_max")
        return {f"{prefix}{name}": float(getattr(self, name)) for name in names}


def ppo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
) -> PolicyLossOutput:
    """PPO's clipped surrogate per token, with an asymmetric band and the dual clip.

    ratio = exp(lp - old); L = max(-A ratio, -A clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high));
    where A < 0, L = min(L, -A clip_ratio_c) bounds the loss of a token whose ratio exploded.

    Args:
        logprob: current log-probs of the sampled tokens, ``[B, T]`` (carries the gradient).
        old_logprob: log-probs under the policy that generated (or the recomputed old policy), ``[B, T]``.
        advantages: ``[B, T]``.
        response_mask: ``[B, T]``, 1 = model token.
        clip_ratio_low: eps_low (0.2 in Search-R1).
        clip_ratio_high: eps_high; ``None`` uses ``clip_ratio_low`` (0.28 with 0.2 is the DAPO / slime setting).
        clip_ratio_c: the dual-clip constant, > 1 (3 by default); ``None`` turns the dual clip off.
    """
    if clip_ratio_high is None:
        clip_ratio_high = clip_ratio_low
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"clip ratios must be >= 0, got low={clip_ratio_low}, high={clip_ratio_high}")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual clip bounds -A * c), got {clip_ratio_c}")
    mask = response_mask.bool()
    old_logprob, advantages = old_logprob.detach(), advantages.detach()

    log_ratio = (logprob - old_logprob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    clip_chosen = clipped > unclipped

    dual_chosen = torch.zeros_like(mask)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        dual_chosen = (advantages < 0) & (losses > bound)
        losses = torch.where(dual_chosen, bound, losses)

    token_losses = zero_outside(losses, mask)
    with torch.no_grad():
        ratio_on_tokens = zero_outside(ratio, mask)
        return PolicyLossOutput(
            token_losses=token_losses,
            clip_fraction=masked_mean(clip_chosen.to(ratio.dtype), mask),
            dual_clip_fraction=masked_mean(dual_chosen.to(ratio.dtype), mask),
            approx_kl=masked_mean(-log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
            ratio_max=ratio_on_tokens.max() if mask.any() else ratio.new_zeros(()),
            clipped=clip_chosen & mask,
        )


PolicyLoss = Callable[..., PolicyLossOutput]
"""``fn(logprob, old_logprob, advantages, *, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c)``:
the loss per model token and its metrics (:class:`PolicyLossOutput`; a loss without clipping reports its clip
fractions as 0). The clip keywords are the ``algorithm`` keys; a loss that reads none of them takes ``**kwargs``."""

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
"""Policy losses by the name ``algorithm.policy_loss`` uses (or a dotted path to one)."""

register_policy_loss = POLICY_LOSSES.register
"""``@register_policy_loss(name, overwrite=False)``: make a policy loss available by name."""

POLICY_LOSSES.register("ppo", ppo_policy_loss)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: ``[B, T, V] -> [B, T]``.

    H = logsumexp(z) - sum softmax(z) z, which avoids log(0) for tokens with zero probability.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_bonus_loss(entropy: torch.Tensor, coef: float, *, response_mask: torch.Tensor) -> torch.Tensor:
    """The entropy term to add to the token losses: ``-coef * entropy`` on model tokens, 0 elsewhere.

    Negative so that minimising the loss raises entropy (``algorithm.entropy_bonus``: Search-R1
    used 0.001, RLinf 0).
    """
    return zero_outside(-coef * entropy, response_mask)


TOP_K_DIVERGENCES = ("forward", "reverse")
"""``algorithm.distill.top_k_divergence``: ``forward`` = KL(teacher || student), GKD's and most distillers'
choice (mass-covering); ``reverse`` = KL(student || teacher) (mode-seeking, the sampled-token term's direction)."""

TAIL_FLOOR = 1e-6
"""Smallest leftover mass a log is taken of: ``1 - sum of k probabilities`` in fp32 is not resolved below
about 1e-7, so a smaller leftover is noise, and the floor keeps its log (and gradient) finite."""


def top_k_kl(teacher_top: torch.Tensor, student_top: torch.Tensor, scored: torch.Tensor,
             divergence: str = "forward") -> torch.Tensor:
    """``[B, T]`` KL between the teacher's and the student's distributions over the teacher's top k tokens plus
    one bucket for the rest of the vocabulary, on ``scored`` tokens (0 elsewhere).

    ``teacher_top`` and ``student_top`` are ``[B, T, k]`` log-probs (each normalised over the whole vocabulary)
    of the same k tokens, the teacher's most likely; padding slots carry -inf in ``teacher_top`` and weigh
    nothing on either side. With ``q_j``, ``p_j`` the k probabilities and ``q_r = 1 - sum q``,
    ``p_r = 1 - sum p`` the leftover masses:

        forward:  sum_j q_j (log q_j - log p_j) + q_r (log q_r - log p_r)
        reverse:  sum_j p_j (log p_j - log q_j) + p_r (log p_r - log q_r)

    Both are KLs between two distributions over k + 1 outcomes: >= 0, and 0 with a zero gradient exactly
    when the student matches the teacher's k probabilities and its leftover mass, so the student is pulled
    to the teacher, not past it onto the top k. Leftover masses are floored at ``TAIL_FLOOR`` inside the logs.
    """
    if divergence not in TOP_K_DIVERGENCES:
        raise ValueError(f"top-k divergence must be one of {', '.join(TOP_K_DIVERGENCES)}, got {divergence!r}")
    valid = torch.isfinite(teacher_top) & scored.unsqueeze(-1)
    # Padded and unscored slots get 0 before any exp or product: a -inf there would make NaN gradients
    # even behind a where().
    t = torch.where(valid, teacher_top.float(), 0.0)
    s = torch.where(valid, student_top.float(), 0.0)
    q = torch.where(valid, t.exp(), 0.0)
    p = torch.where(valid, s.exp(), 0.0)
    log_q_rest = (1 - q.sum(-1)).clamp(min=TAIL_FLOOR).log()
    log_p_rest = (1 - p.sum(-1)).clamp(min=TAIL_FLOOR).log()
    if divergence == "forward":
        kl = (q * (t - s)).sum(-1) + log_q_rest.exp() * (log_q_rest - log_p_rest)
    else:
        kl = (p * (s - t)).sum(-1) + log_p_rest.exp() * (log_p_rest - log_q_rest)
    return torch.where(scored, kl, torch.zeros_like(kl))


@dataclass
class ValueLossOutput:
    """The critic's clipped loss per token and what to log about it."""

    token_losses: torch.Tensor
    """``[B, T]``: 0.5 max((V - R)^2, (V_clipped - R)^2) per model token; 0 on mask-0 tokens."""
    clip_fraction: torch.Tensor
    """Share of model tokens where the clipped prediction gave the larger loss."""

    def metrics(self, prefix: str = "critic/") -> dict[str, float]:
        """The scalar metrics as floats, for a logger."""
        return {f"{prefix}clip_fraction": float(self.clip_fraction)}


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    cliprange_value: float,
) -> ValueLossOutput:
    """PPO's clipped value loss (as in verl): the new prediction may move at most ``cliprange_value``
    from the value at rollout time before its loss stops improving.

    Args:
        values: the critic's current predictions, ``[B, T]`` (carries the gradient).
        old_values: the predictions used for the advantages, ``[B, T]``.
        returns: GAE's targets (advantages before whitening + old values), ``[B, T]``.
        response_mask: ``[B, T]``, 1 = model token.
        cliprange_value: how far a prediction may move from ``old_values``.
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    loss_unclipped = (values - returns).square()
    loss_clipped = (clipped_values - returns).square()
    losses = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        clip_fraction = masked_mean((loss_clipped > loss_unclipped).to(values.dtype), response_mask)
    return ValueLossOutput(token_losses=zero_outside(losses, response_mask), clip_fraction=clip_fraction)

"""Per-token KL estimators to the reference model, by the name ``algorithm.kl_penalty_type`` uses.

Every estimator takes the current (or rollout) log-probs ``lp`` and the reference log-probs ``ref``
of the sampled tokens, ``[B, T]`` each, and returns ``[B, T]``. See docs/ALGORITHMS.md:

- ``k1``: lp - ref (unbiased, can be negative per token).
- ``k2``: 0.5 (lp - ref)^2.
- ``k3`` / ``low_var_kl``: exp(x) - x - 1 with x = ref - lp clamped to [-20, 20] and the result
  clamped to [-10, 10] (verl's clamps: one wild token cannot dominate the loss).

Used two ways: as a loss term (``kl_beta * aggregate_loss(kl_penalty(...))``, Search-R1 / RLinf /
slime with k3 and 0.001) or folded into the rewards (:func:`apply_kl_to_token_rewards`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlinf_search.algorithms.aggregation import zero_outside
from rlinf_search.registry import Registry

KL_LOG_RATIO_CLAMP = 20.0
"""k3's x = ref - lp is clamped to +-20 before exp, so exp cannot overflow."""
KL_VALUE_CLAMP = 10.0
"""k3's result is clamped to +-10 per token."""

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL penalty")
"""KL estimators by the name ``algorithm.kl_penalty_type`` uses (or a dotted path to one); ``k3`` and
``low_var_kl`` are the same function."""

register_kl = KL_ESTIMATORS.register
"""``@register_kl(name, overwrite=False)``: make an estimator ``fn(logprob, ref_logprob)`` available by name."""


@register_kl("k1")
def k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


@register_kl("k2")
def k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


@register_kl("k3")
def k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    x = (ref_logprob - logprob).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (torch.exp(x) - x - 1).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


register_kl("low_var_kl")(k3)


def kl_penalty(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    kind: str = "low_var_kl",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of kind ``k1``, ``k2``, ``k3``/``low_var_kl`` (or a registered one).

    With ``mask``, mask-0 tokens are set to 0 (whatever their log-probs were).
    """
    kl = KL_ESTIMATORS.resolve(kind)(logprob, ref_logprob)
    if mask is not None:
        kl = zero_outside(kl, mask)
    return kl


def apply_kl_to_token_rewards(
    token_rewards: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    *,
    beta: float,
    mask: torch.Tensor,
    kind: str = "k1",
) -> torch.Tensor:
    """The in-reward KL variant: ``r_t - beta * kl_t`` on model tokens, ``r_t`` elsewhere (a new tensor).

    ``logprob`` is the policy that sampled (rollout or recomputed old log-probs): the penalty is a
    fixed part of the reward, so it carries no gradient.
    """
    kl = kl_penalty(logprob.detach(), ref_logprob.detach(), kind, mask=mask)
    return token_rewards - beta * kl

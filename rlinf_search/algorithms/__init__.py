"""RL algorithm pieces in pure torch: advantages, KL, policy/value losses, aggregation, mismatch correction.

Tensors are batch-first ``[B, T]`` over response tokens with a ``response_mask`` (1 = model token,
0 = observation or padding); everything acts only on mask-1 tokens. Variants are small functions in
registries (:class:`rlinf_search.registry.Registry`) keyed by config names; user code is named by
dotted path and found by the same ``resolve``.
"""

from rlinf_search.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageOutput,
    AdvantageTraits,
    advantage_traits,
    compute_advantages,
    estimators_with,
    register_advantage,
    traits_of,
)
from rlinf_search.algorithms.aggregation import (
    LOSS_AGGREGATIONS,
    aggregate_loss,
    masked_mean,
    masked_sum,
    masked_whiten,
)
from rlinf_search.algorithms.importance import (
    MISMATCH_CORRECTIONS,
    ImportanceWeights,
    masked_is_weights,
    truncated_is_weights,
)
from rlinf_search.algorithms.kl import KL_ESTIMATORS, apply_kl_to_token_rewards, kl_penalty, register_kl
from rlinf_search.algorithms.losses import (
    POLICY_LOSSES,
    PolicyLossOutput,
    ValueLossOutput,
    clipped_value_loss,
    entropy_bonus_loss,
    entropy_from_logits,
    ppo_policy_loss,
    register_policy_loss,
    TOP_K_DIVERGENCES,
    top_k_kl,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "MISMATCH_CORRECTIONS",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageTraits",
    "advantage_traits",
    "estimators_with",
    "traits_of",
    "ImportanceWeights",
    "PolicyLossOutput",
    "ValueLossOutput",
    "aggregate_loss",
    "apply_kl_to_token_rewards",
    "clipped_value_loss",
    "compute_advantages",
    "entropy_bonus_loss",
    "entropy_from_logits",
    "kl_penalty",
    "masked_is_weights",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "ppo_policy_loss",
    "TOP_K_DIVERGENCES",
    "top_k_kl",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
    "truncated_is_weights",
]

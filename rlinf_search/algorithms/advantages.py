"""Advantage estimators, registered by the name ``algorithm.adv_type`` uses.

An estimator is ``fn(inputs: AdvantageInputs) -> AdvantageOutput``. Add one with
``@register_advantage("my_name", traits=AdvantageTraits(...))`` or name it in the config by dotted path
(``my_pkg.adv.my_fn``), its traits then declared with ``@advantage_traits(...)`` on the function. The traits say
what the run must give it (groups of two or more, a critic) and whether it can stream; start-up checks them. An
estimator with keys of its own declares their pydantic model with ``@with_settings(Model)``: start-up validates
``algorithm.adv_settings`` with it and the estimator reads the result as ``inputs.settings``.

Conventions (checked against verl's ``core_algos.py``; see docs/ALGORITHMS.md):

- Group statistics use the *unbiased* standard deviation (``torch.std``, Bessel's correction), as
  verl's ``compute_grpo_outcome_advantage`` and RLinf do, and ``eps = 1e-6`` outside the square root.
- A group of one has advantage 0 in every group estimator (its group mean is its own reward).
  verl differs here: it sets a singleton's mean to 0 and std to 1, passing the raw reward through.
- Returns, REINFORCE++ and GAE run over model tokens only: an observation token is skipped, not a
  time step, so the successor of the last token of one turn is the first token of the next turn.
  verl's REINFORCE++ instead resets its running return on every mask-0 token, which in a multi-turn
  rollout cuts the final reward off from every turn but the last.
- Whitening (REINFORCE++ always, GAE when ``normalize_advantages``) uses the mean and unbiased
  variance over every model token of the batch, like verl's ``masked_whiten``; the baseline variant
  subtracts the group mean *before* the returns are whitened, as verl does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlinf_search.algorithms.aggregation import masked_sum, masked_whiten, zero_outside
from rlinf_search.registry import Registry


@dataclass
class AdvantageInputs:
    """Everything an estimator may read. Give exactly one of ``rewards`` and ``token_rewards``."""

    response_mask: torch.Tensor
    """``[B, T]``: 1 for model tokens, 0 for observation tokens and padding."""
    rewards: torch.Tensor | None = None
    """``[B]``: one reward per trajectory (placed on its last model token where a per-token reward is needed)."""
    token_rewards: torch.Tensor | None = None
    """``[B, T]``: reward per token (e.g. the outcome on the last model token minus an in-reward KL
    penalty); values on mask-0 tokens are ignored. Group estimators use its sum over model tokens."""
    uids: Sequence[Hashable] | None = None
    """``B`` hashable ids, one per trajectory; trajectories with the same uid form a group (any order)."""
    values: torch.Tensor | None = None
    """``[B, T]``: the critic's value per token (GAE only)."""
    gamma: float = 1.0
    """Discount per model token (REINFORCE++, GAE); Search-R1 used 1."""
    lam: float = 1.0
    """GAE's lambda; Search-R1 used 1."""
    eps: float = 1e-6
    """Added to the group std before dividing (GRPO); verl and RLinf use 1e-6."""
    normalize_advantages: bool = True
    """GAE only: whiten the advantages over the batch's model tokens (verl always does)."""
    settings: Any = None
    """The estimator's own settings: the pydantic model it declares (``plugin_settings.with_settings``), validated
    from ``algorithm.adv_settings`` at start-up; None for an estimator that declares none."""

    def __post_init__(self) -> None:
        if self.response_mask.dim() != 2:
            raise ValueError(f"response_mask must be [B, T], got shape {tuple(self.response_mask.shape)}")
        batch = self.response_mask.shape[0]
        if (self.rewards is None) == (self.token_rewards is None):
            raise ValueError("give exactly one of rewards [B] and token_rewards [B, T]")
        if self.rewards is not None and tuple(self.rewards.shape) != (batch,):
            raise ValueError(f"rewards must be [B] = [{batch}], got {tuple(self.rewards.shape)}")
        for name in ("token_rewards", "values"):
            tensor = getattr(self, name)
            if tensor is not None and tensor.shape != self.response_mask.shape:
                raise ValueError(f"{name} {tuple(tensor.shape)} must match response_mask "
                                 f"{tuple(self.response_mask.shape)}")
        if self.uids is not None and len(self.uids) != batch:
            raise ValueError(f"uids has {len(self.uids)} ids for a batch of {batch}")

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype the estimators compute in (the rewards', or float32 for integer rewards)."""
        source = self.rewards if self.rewards is not None else self.token_rewards
        return source.dtype if source.is_floating_point() else torch.float32

    def sequence_rewards(self) -> torch.Tensor:
        """``[B]``: ``rewards``, or the sum of ``token_rewards`` over each trajectory's model tokens."""
        if self.rewards is not None:
            return self.rewards.to(self.dtype)
        return masked_sum(self.token_rewards.to(self.dtype), self.response_mask, dim=-1)

    def per_token_rewards(self) -> torch.Tensor:
        """``[B, T]``: ``token_rewards`` on model tokens, or ``rewards`` on each last model token."""
        if self.token_rewards is not None:
            return zero_outside(self.token_rewards.to(self.dtype), self.response_mask)
        return place_on_last_model_token(self.rewards.to(self.dtype), self.response_mask)

    def require_uids(self) -> Sequence[Hashable]:
        """``uids``; ValueError when a group estimator got none."""
        if self.uids is None:
            raise ValueError("this advantage estimator groups trajectories by uid: pass uids")
        return self.uids


@dataclass
class AdvantageOutput:
    """What an estimator returns; both tensors are 0 on mask-0 tokens."""

    advantages: torch.Tensor
    """``[B, T]``: the advantage of each model token."""
    returns: torch.Tensor
    """``[B, T]``: the critic's regression target (GAE), the unwhitened token returns (REINFORCE++),
    or the advantages themselves (estimators without a critic, as in verl)."""


AdvantageEstimator = Callable[[AdvantageInputs], AdvantageOutput]

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
"""Advantage estimators by the name ``algorithm.adv_type`` uses (or a dotted path to one)."""


@dataclass(frozen=True)
class AdvantageTraits:
    """What an estimator needs from the run, declared with it; an estimator that declares nothing gets these
    defaults: it needs neither groups nor a critic, and cannot stream."""

    group_local: bool = False
    """A trajectory's advantage reads only the rewards of its own group, so a mini-batch of whole groups gets the
    advantages the whole batch would give it: ``runner.pipeline`` stream and async need this."""
    needs_group: bool = False
    """It compares the samples of one prompt, so ``algorithm.group_size`` must be >= 2 (a group of one has
    advantage 0)."""
    needs_critic: bool = False
    """It bootstraps from a value model: ``critic.use_critic_model: true``, and a critic is useless without it."""


TRAITS_ATTRIBUTE = "advantage_traits"
"""The attribute an estimator's traits are kept in (set by ``register_advantage`` or ``@advantage_traits``)."""


def advantage_traits(**traits: bool) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator declaring an estimator's :class:`AdvantageTraits` (for one named by dotted path)."""
    declared = AdvantageTraits(**traits)

    def declare(estimator: AdvantageEstimator) -> AdvantageEstimator:
        setattr(estimator, TRAITS_ATTRIBUTE, declared)
        return estimator

    return declare


def traits_of(estimator: AdvantageEstimator) -> AdvantageTraits:
    """The traits ``estimator`` declared, or the defaults."""
    return getattr(estimator, TRAITS_ATTRIBUTE, AdvantageTraits())


def register_advantage(name: str, estimator: AdvantageEstimator | None = None, *,
                       traits: AdvantageTraits | None = None, overwrite: bool = False):
    """``@register_advantage(name, traits=..., overwrite=False)``: make an estimator available by name, with its
    traits (else those it declared with ``@advantage_traits``, else the defaults)."""
    if estimator is None:
        return lambda fn: register_advantage(name, fn, traits=traits, overwrite=overwrite)
    if traits is not None:
        setattr(estimator, TRAITS_ATTRIBUTE, traits)
    return ADVANTAGE_ESTIMATORS.register(name, estimator, overwrite=overwrite)


def estimators_with(**wanted: bool) -> list[str]:
    """The registered estimators whose traits match ``wanted`` (``group_local=True``), for messages."""
    return [name for name in ADVANTAGE_ESTIMATORS.names()
            if all(getattr(traits_of(ADVANTAGE_ESTIMATORS[name]), key) == value for key, value in wanted.items())]


GROUP = AdvantageTraits(group_local=True, needs_group=True)
"""The group-relative estimators' traits."""


def compute_advantages(name: str, **inputs) -> AdvantageOutput:
    """Run the estimator ``name`` (registered name or dotted path) on ``AdvantageInputs(**inputs)``.

    A misspelt input raises TypeError (the dataclass has no such field).
    """
    estimator = ADVANTAGE_ESTIMATORS.resolve(name)
    with torch.no_grad():
        return estimator(AdvantageInputs(**inputs))


# ---- shared pieces ------------------------------------------------------------------------------


def place_on_last_model_token(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` zeros with ``rewards[i]`` on row i's last mask-1 token (nowhere if the row has none)."""
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=-1).values
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows]
    return out


def group_stats(scores: torch.Tensor, uids: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: its group's mean, unbiased std (0 for a group of one) and size, each ``[B]``."""
    if isinstance(uids, torch.Tensor):
        uids = uids.tolist()  # tensor elements hash by identity: every one would be its own group
    group_of: dict[Hashable, int] = {}
    index = torch.tensor([group_of.setdefault(uid, len(group_of)) for uid in uids], device=scores.device)
    num_groups = len(group_of)
    size = scores.new_zeros(num_groups).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add_(0, index, scores)
    mean = (total / size)[index]
    squares = torch.zeros_like(size).index_add_(0, index, (scores - mean) ** 2)
    std = (squares / (size - 1).clamp(min=1)).sqrt()[index]
    return mean, std, size[index]


def discounted_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over model tokens, where ``next`` is the next *model* token.

    Observation tokens are skipped (they are not time steps) and get 0.
    """
    mask = response_mask.bool()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = zero_outside(running, mask[:, t])
    return returns


def _broadcast(per_sequence: torch.Tensor, inputs: AdvantageInputs) -> AdvantageOutput:
    advantages = zero_outside(per_sequence.unsqueeze(-1).expand(inputs.response_mask.shape), inputs.response_mask)
    return AdvantageOutput(advantages=advantages, returns=advantages)


# ---- estimators ---------------------------------------------------------------------------------


@register_advantage("grpo", traits=GROUP)
def grpo(inputs: AdvantageInputs) -> AdvantageOutput:
    """A_i = (r_i - mean_g) / (std_g + eps), unbiased std; 0 for a group of one."""
    scores = inputs.sequence_rewards()
    mean, std, size = group_stats(scores, inputs.require_uids())
    advantage = torch.where(size > 1, (scores - mean) / (std + inputs.eps), torch.zeros_like(scores))
    return _broadcast(advantage, inputs)


@register_advantage("grpo_no_std", traits=GROUP)
def grpo_no_std(inputs: AdvantageInputs) -> AdvantageOutput:
    """Dr. GRPO: A_i = r_i - mean_g (0 for a group of one)."""
    scores = inputs.sequence_rewards()
    mean, _, _ = group_stats(scores, inputs.require_uids())
    return _broadcast(scores - mean, inputs)


@register_advantage("rloo", traits=GROUP)
def rloo(inputs: AdvantageInputs) -> AdvantageOutput:
    """A_i = r_i - mean of the other G-1 rewards = G/(G-1) (r_i - mean_g); 0 for a group of one."""
    scores = inputs.sequence_rewards()
    mean, _, size = group_stats(scores, inputs.require_uids())
    advantage = torch.where(size > 1, size / (size - 1).clamp(min=1) * (scores - mean), torch.zeros_like(scores))
    return _broadcast(advantage, inputs)


@register_advantage("reinforce_plus_plus")
def reinforce_plus_plus(inputs: AdvantageInputs) -> AdvantageOutput:
    """Per-token discounted return (over model tokens), whitened over every model token of the batch."""
    returns = discounted_returns(inputs.per_token_rewards(), inputs.response_mask, inputs.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, inputs.response_mask), returns=returns)


# Whitened over the batch, so not group-local, but it subtracts each group's mean first.
@register_advantage("reinforce_plus_plus_baseline", traits=AdvantageTraits(needs_group=True))
def reinforce_plus_plus_baseline(inputs: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++ after subtracting each group's mean reward (on the last model token), then whitening."""
    mean, _, _ = group_stats(inputs.sequence_rewards(), inputs.require_uids())
    token_rewards = inputs.per_token_rewards() - place_on_last_model_token(mean, inputs.response_mask)
    returns = discounted_returns(token_rewards, inputs.response_mask, inputs.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, inputs.response_mask), returns=returns)


@register_advantage("gae", traits=AdvantageTraits(needs_critic=True))
def gae(inputs: AdvantageInputs) -> AdvantageOutput:
    """GAE over model tokens: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next.

    ``next`` is the next *model* token: observation tokens are skipped, so the value successor of a
    turn's last token is the first token of the next turn (the reference Search-R1 code ran GAE
    across observation tokens too). After the last model token V_next = 0. returns = A + V, taken
    before the optional whitening of A.
    """
    if inputs.values is None:
        raise ValueError("gae needs the critic's values [B, T]")
    mask = inputs.response_mask.bool()
    rewards, values = inputs.per_token_rewards(), inputs.values.to(inputs.dtype)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + inputs.gamma * next_value - values[:, t]
        current = delta + inputs.gamma * inputs.lam * next_advantage
        next_advantage = torch.where(mask[:, t], current, next_advantage)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = zero_outside(current, mask[:, t])
    returns = zero_outside(advantages + values, mask)
    if inputs.normalize_advantages:
        advantages = masked_whiten(advantages, inputs.response_mask)
    return AdvantageOutput(advantages=advantages, returns=returns)
